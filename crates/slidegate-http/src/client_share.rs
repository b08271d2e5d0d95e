//! A client's share of places many clients take at once — `serve`'s
//! upstream connections, the requests rules' `delay` holds — that shrinks
//! as the places fill.
//!
//! A fixed share alone lets a few clients together take every place, and
//! one client has as many shares as it has identities if the share is per
//! identity (API keys are not verified; a key per request is free). So a
//! client holding `h` places may take one more only while more than
//! [`FREE_PER_HELD`] × `h` are free: its first always goes on (if a place is
//! free at all), a client alone takes at most a fifth of the places, and
//! however many clients hold some, the free places stay above four times
//! what the smallest of them holds — the rest is left to the clients
//! holding least. Only as many clients as there are places, each holding
//! one, can take them all.
//!
//! A client is its address as the limits group it (after the trusted
//! proxies, IPv6 by `ipv6_prefix`); each place-keeper counts it under a
//! keyed hash of its own.

/// A client holding `h` places may take one more only while more than
/// `FREE_PER_HELD × h` are free: at most a fifth of the places for one
/// client, 51 each of 1,024 for sixteen.
pub const FREE_PER_HELD: usize = 4;

/// Whether a client holding `held` places is refused one more because only
/// `free` are free (not counting the one it asks for): no more than
/// [`FREE_PER_HELD`] × `held`. A client holding none is never crowded out.
///
/// ```
/// use slidegate_http::client_share::crowded;
///
/// assert!(!crowded(0, 1), "a first place, while one is free");
/// assert!(!crowded(1, 5));
/// assert!(crowded(1, 4));
/// ```
pub fn crowded(held: usize, free: usize) -> bool {
    held > 0 && free <= FREE_PER_HELD.saturating_mul(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most a client alone takes of `places`, one at a time.
    fn alone(places: usize) -> usize {
        let mut held = 0;
        while held < places && !crowded(held, places - held) {
            held += 1;
        }
        held
    }

    #[test]
    fn a_client_alone_takes_a_fifth_rounded_up_and_at_least_one() {
        let taken: Vec<usize> = [1, 3, 5, 6, 10, 12, 1_000].into_iter().map(alone).collect();
        assert_eq!(taken, [1, 1, 1, 2, 2, 3, 200]);
    }

    #[test]
    fn the_free_places_stay_above_four_times_what_each_holder_holds() {
        // Ten places, one client holding two: 8 free, not more than 4 × 2.
        assert!(crowded(2, 8));
        assert!(!crowded(2, 9));
        // Whatever is held, a client holding nothing is never crowded out.
        assert!(!crowded(0, 0));
        // No overflow at the edges.
        assert!(crowded(usize::MAX, usize::MAX));
        assert!(!crowded(1, usize::MAX));
    }
}
