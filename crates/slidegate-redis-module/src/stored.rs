//! Each algorithm's stored value: read into `slidegate::algorithm`'s state,
//! decided with its own function, and written back as the Lua script would
//! write it, with the key's expiry. The one place a stored format lives in
//! Rust; `store/redis/<name>.lua` is the other side of each.

use redis_module::RedisError;
use slidegate::algorithm::{fixed_window, gcra, sliding_window_counter as swc, token_bucket};
use slidegate::{Algorithm, Decision};

use crate::layout::{count_at, double, push_count, push_uint, uint, unwrap_window, Value, TWO_32, TWO_48};
use crate::wire::{whole, Args, Leased};

/// What a decision writes: the new value and its expiry.
pub struct Write {
    pub value: Value,
    pub expiry: Expiry,
}

/// When a written key expires.
pub enum Expiry {
    /// The key already carries the right expiry.
    Keep,
    /// The state stops mattering at this time, on the decision's clock.
    IdleAt(u64),
}

/// A decision and what it writes, if anything.
type Outcome = Result<(Decision, Option<Write>), RedisError>;

/// A window algorithm's decision, what it writes, and the number of the
/// window it was decided in, modulo 2^32 (`lease.lua`'s fifth double).
type Windowed = Result<(Decision, Option<Write>, u64), RedisError>;

/// Decides on the value a script would have left (`None`: no key).
pub fn decide(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    match a.algorithm {
        Algorithm::SlidingWindowCounter => sliding_window_counter(stored, now, a).map(|(d, w, _)| (d, w)),
        Algorithm::FixedWindow => fixed_window(stored, now, a).map(|(d, w, _)| (d, w)),
        Algorithm::Gcra => gcra(stored, now, a),
        Algorithm::TokenBucket => token_bucket(stored, now, a),
        Algorithm::SlidingLog => {
            Err(RedisError::Str("ERR slidegate: the sliding log is decided by the Lua scripts"))
        }
    }
}

/// `lease.lua`: the decision `decide` makes on a lease's permits, and the
/// window they were charged in (modulo 2^32), which `give_back` takes. Only
/// the window algorithms are leased (`slidegate::store::lease::leasable`).
pub fn lease(stored: Option<&[u8]>, now: u64, a: &Args) -> Windowed {
    match a.algorithm {
        Algorithm::SlidingWindowCounter => sliding_window_counter(stored, now, a),
        Algorithm::FixedWindow => fixed_window(stored, now, a),
        Algorithm::SlidingLog | Algorithm::TokenBucket | Algorithm::Gcra => Err(RedisError::Str(
            "ERR slidegate: only the fixed window and the sliding window counter are leased",
        )),
    }
}

/// `give_back.lua`: up to `unused` permits undone in the window `window`
/// (modulo 2^32) was charged in, from its count while it is the stored
/// window, or (the counter only) from the previous count while the stored
/// window is the next one; nothing otherwise. Answers how many, and the
/// value to write in place (the key keeps its expiry), when any.
pub fn give_back(
    stored: &[u8],
    leased: Leased,
    limit: u64,
    window: u64,
    unused: u64,
) -> Result<(u64, Option<Write>), RedisError> {
    let small = limit < TWO_32;
    let n = if small { 4 } else { 8 };
    let s_window = uint(stored.get(..4).ok_or_else(corrupt)?);
    let count = |at: usize| stored.get(at..).and_then(|rest| count_at(rest, small)).ok_or_else(corrupt);
    let mut value = Value::new();
    push_uint(&mut value, s_window, 4);
    let back = match leased {
        Leased::SlidingWindowCounter => {
            let (cur, prev) = (count(4)?, count(4 + n)?);
            let (back, cur, prev) = if s_window == window {
                let back = unused.min(cur);
                (back, cur - back, prev)
            } else if s_window == (window + 1) % TWO_32 {
                let back = unused.min(prev);
                (back, cur, prev - back)
            } else {
                (0, cur, prev)
            };
            push_count(&mut value, cur, small);
            push_count(&mut value, prev, small);
            back
        }
        Leased::FixedWindow => {
            let count = count(4)?;
            let back = if s_window == window { unused.min(count) } else { 0 };
            push_count(&mut value, count - back, small);
            back
        }
    };
    Ok((back, (back > 0).then_some(Write { value, expiry: Expiry::Keep })))
}

/// The window a window algorithm decides in at `now`, modulo 2^32, as the
/// scripts number it: now's, or a later one where a state that counts
/// something lies ahead (a clock that stepped back decides in the state's
/// window, `algorithm::skew_ms`) — on a denial too, where nothing is written.
fn decided_window(counting_window: Option<u64>, now: u64, w: u64) -> u64 {
    let now_window = now / w;
    counting_window.filter(|&s| s > now_window).unwrap_or(now_window) % TWO_32
}

fn corrupt() -> RedisError {
    RedisError::Str("ERR slidegate: the key holds a value no script wrote")
}

/// Whether the decision changes the state (a denial or a peek writes nothing).
fn charged(d: &Decision, a: &Args) -> bool {
    d.allowed && a.cost > 0
}

/// `sliding_window_counter.lua`: window mod 2^32 (4 bytes), then the current
/// and previous counts (4 bytes each below 2^32, else doubles).
fn sliding_window_counter(stored: Option<&[u8]>, now: u64, a: &Args) -> Windowed {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit < TWO_32;
    let state = match stored {
        None => None,
        Some(v) => {
            let window = uint(v.get(..4).ok_or_else(corrupt)?);
            let n = if small { 4 } else { 8 };
            let cur = count_at(v.get(4..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            let prev = count_at(v.get(4 + n..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            unwrap_window(window, now / w).map(|window| swc::State { window, cur, prev })
        }
    };
    let counting = state.filter(|s| s.cur > 0 || s.prev > 0).map(|s| s.window);
    let window = decided_window(counting, now, w);
    let (after, d) = swc::decide(state.unwrap_or_default(), now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None, window));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.window % TWO_32, 4);
    push_count(&mut value, after.cur, small);
    push_count(&mut value, after.prev, small);
    let same_window = state.is_some_and(|s| s.window == after.window);
    let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + 2 * w) };
    Ok((d, Some(Write { value, expiry }), window))
}

/// `fixed_window.lua`: window mod 2^32 (4 bytes), then the count (4 bytes
/// below 2^32, else a double).
fn fixed_window(stored: Option<&[u8]>, now: u64, a: &Args) -> Windowed {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit < TWO_32;
    let state = match stored {
        None => None,
        Some(v) => {
            let window = uint(v.get(..4).ok_or_else(corrupt)?);
            let count = count_at(v.get(4..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            unwrap_window(window, now / w).map(|window| fixed_window::State { window, count })
        }
    };
    let counting = state.filter(|s| s.count > 0).map(|s| s.window);
    let window = decided_window(counting, now, w);
    let (after, d) = fixed_window::decide(state.unwrap_or_default(), now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None, window));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.window % TWO_32, 4);
    push_count(&mut value, after.count, small);
    let same_window = state.is_some_and(|s| s.window == after.window);
    let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + w) };
    Ok((d, Some(Write { value, expiry }), window))
}

/// `gcra.lua`: the theoretical arrival time in ms (6 bytes) and its
/// fraction of a ms in ticks (7 bytes).
fn gcra(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let state = match stored {
        None => gcra::State::default(),
        Some(v) if v.len() == 13 => gcra::State { tat_ms: uint(&v[..6]), frac: uint(&v[6..]) },
        // The layout before exact ticks: the TAT in µs, read as the script reads it.
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .and_then(whole)
            .map_or_else(gcra::State::default, |us| gcra::State { tat_ms: us.div_ceil(1000), frac: 0 }),
    };
    let (after, d) = gcra::decide(state, now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.tat_ms, 6);
    push_uint(&mut value, after.frac, 7);
    let idle_at = after.tat_ms + u64::from(after.frac > 0);
    Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
}

/// `token_bucket.lua`: the tokens missing from a full bucket, in 1/window
/// units (6 bytes while limit × window < 2^48, else a double), then the
/// time of the last decision (6 bytes).
fn token_bucket(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit * w < TWO_48;
    let state = match stored {
        None => token_bucket::State::default(),
        Some(v) => {
            let (used, rest) = if small {
                (uint(v.get(..6).ok_or_else(corrupt)?), v.get(6..))
            } else {
                (double(v).ok_or_else(corrupt)?, v.get(8..))
            };
            let last_ms = uint(rest.filter(|r| r.len() == 6).ok_or_else(corrupt)?);
            token_bucket::State { used, last_ms }
        }
    };
    let (after, d) = token_bucket::decide(state, now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    if small {
        push_uint(&mut value, after.used, 6);
    } else {
        value.extend_from_slice(&(after.used as f64).to_le_bytes());
    }
    push_uint(&mut value, after.last_ms, 6);
    let idle_at = after.last_ms + after.used.div_ceil(limit);
    Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn args(algorithm: Algorithm, limit: u64, window_ms: u64, cost: u64) -> Args {
        let quota = slidegate::Quota::new(limit, Duration::from_millis(window_ms)).expect("valid quota");
        Args { algorithm, quota, cost }
    }

    fn written(write: Option<Write>) -> Vec<u8> {
        write.and_then(|w| w.value.as_slice().map(<[u8]>::to_vec)).unwrap_or_default()
    }

    /// `lease.lua` answers the window a decision was made in, modulo 2^32,
    /// on a denial too: now's, or the stored one a clock stepped back from.
    #[test]
    fn a_lease_answers_the_window_it_decided_in() {
        let a = args(Algorithm::FixedWindow, 10, 250, 8);
        let now = (TWO_32 + 5) * 250 + 17;
        let (d, write, window) = lease(None, now, &a).expect("decides");
        assert!(d.allowed);
        assert_eq!(window, 5);
        let stored = written(write);
        assert_eq!(stored, [5, 0, 0, 0, 8, 0, 0, 0]);
        // Denied, and a clock two windows back: still window 5, nothing written.
        let (d, write, window) = lease(Some(&stored), now - 500, &a).expect("decides");
        assert!(!d.allowed);
        assert!(write.is_none());
        assert_eq!(window, 5);
        let counter = args(Algorithm::SlidingWindowCounter, 10, 250, 3);
        let (d, _, window) = lease(None, now + 250, &counter).expect("decides");
        assert_eq!((d.allowed, window), (true, 6));
        for other in [Algorithm::SlidingLog, Algorithm::TokenBucket, Algorithm::Gcra] {
            assert!(lease(None, now, &args(other, 10, 250, 1)).is_err(), "{other}");
        }
    }

    #[test]
    fn give_back_undoes_the_window_it_names_and_nothing_else() {
        // The counter in window 9: cur 6, prev 4.
        let stored = [9, 0, 0, 0, 6, 0, 0, 0, 4, 0, 0, 0];
        let swc = Leased::SlidingWindowCounter;
        let (back, write) = give_back(&stored, swc, 10, 9, 8).expect("gives back");
        assert_eq!((back, written(write)), (6, vec![9, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0]));
        let (back, write) = give_back(&stored, swc, 10, 8, 3).expect("gives back");
        assert_eq!((back, written(write)), (3, vec![9, 0, 0, 0, 6, 0, 0, 0, 1, 0, 0, 0]));
        for window in [7, 10] {
            let (back, write) = give_back(&stored, swc, 10, window, 3).expect("gives back");
            assert_eq!((back, write.is_none()), (0, true), "window {window}");
        }
        // Window numbers wrap: the window before 0 is 2^32 − 1.
        let wrapped = [0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0];
        let (back, _) = give_back(&wrapped, swc, 10, TWO_32 - 1, 5).expect("gives back");
        assert_eq!(back, 2);
        // The fixed window gives back only to its own window; wide counts are doubles.
        let mut wide = vec![3, 0, 0, 0];
        wide.extend_from_slice(&7e9f64.to_le_bytes());
        let fw = Leased::FixedWindow;
        let (back, write) = give_back(&wide, fw, 1 << 33, 3, 5).expect("gives back");
        let mut want = vec![3, 0, 0, 0];
        want.extend_from_slice(&(7e9f64 - 5.0).to_le_bytes());
        assert_eq!((back, written(write)), (5, want));
        assert_eq!(give_back(&wide, fw, 1 << 33, 2, 5).expect("gives back").0, 0);
        assert!(give_back(&[3, 0, 0], fw, 10, 3, 1).is_err(), "a value no script wrote");
    }
}
