//! The Lua scripts, assembled once from the `*.lua` pieces beside this file.
//!
//! Each algorithm's arithmetic exists once in Lua, in `<name>.lua`
//! (mirroring `crate::algorithm::<name>`; [`Scripted`] names the file and
//! the algorithm's key tag). A script is a main file whose `--! include prelude.lua` line
//! pulls in the shared prelude (clock, expiry, the rules of exact
//! arithmetic) and whose algorithm lines pull in algorithm files in one of
//! two forms:
//!
//! - `decide.lua`, once per algorithm (its `ALGORITHM` / `TAG` placeholders
//!   filled in), **inlines** the algorithm's sections with `--! inline
//!   <name>.lua`: one flat chunk that defines no function. Redis runs a
//!   script's chunk anew on every call, and every `local function` in it is a
//!   closure allocated (and later collected) on every call; a single limit,
//!   the common case, pays for none.
//! - `decide_all.lua` (and the penalty box built on it) decides several limits
//!   of any algorithms in a loop, so its `--! algorithms` line becomes every
//!   algorithm's sections wrapped as three **functions** each, and the
//!   dispatch table built from [`Algorithm::ALL`].
//!
//! Scripts start with the main file's comment block, which gives KEYS, ARGV
//! and the reply.
//!
//! # The contract of an algorithm file
//!
//! `<name>.lua` is a comment block, two declarations and three sections of
//! straight-line code (no `return`, no function definitions):
//!
//! - `--! state a, b, c` names the identity's state as loaded (at most three
//!   values); `--! charged x, y, …` names the state after charging (at most
//!   four), distinct from the state's names.
//! - `--! load` reads the identity's state at `key` (given `limit`, `w`) and
//!   assigns the state's names (a missing key reads as a fresh identity). It
//!   only reads.
//! - `--! decide` decides `cost` permits at the prelude's `now` on that state
//!   (given `limit`, `w`) and assigns `allowed, remaining, reset, retry` (ms;
//!   retry -1 when allowed) and the charged names. It writes nothing (it may
//!   read more of the key, as the sliding log does) and in `decide_all.lua`
//!   is also run with cost 0 to peek.
//! - `--! commit` writes the charged state to `key` and sets the key's TTL in
//!   the same write (given `limit`, `w`, `cost` and the charged names). It
//!   runs only when the decision allowed a cost above 0.
//!
//! After every decision in client time, charged or not, [`KEEP`] (or the
//! file's own `--! keep` section, after its commit: the packed files', and
//! the sliding log's, whose key lives by its newest entry) makes the key outlive its state by exactly
//! the slack, given `key`, `w` and the decision's `reset`: the TTL a write
//! set runs on Redis's clock, so a client clock that stepped back (or lags)
//! would see the state expire while it still matters, and Redis would then
//! admit what the embedded store refuses; and a TTL lengthened then would
//! outlive the state by the step once the clock caught up. It sets the TTL
//! both ways, never creates a key, and leaves one without expiry alone.
//!
//! A section's own `local`s stay inside it. `limit`, `w` (the window in ms)
//! and `cost` are integers below 2^53, as are all values in the state;
//! arithmetic follows the prelude's rules.

use std::sync::LazyLock;

use redis::Script;

use super::Layout;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_log::SlidingLog;
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::{for_each_algorithm, Definition};
use crate::Algorithm;

/// Which layout a script is assembled for: the packed one replaces the
/// load and commit sections of the algorithms it packs with those of
/// `<name>_packed.lua`, and keeps the main files' `--! packed` lines where
/// the per-key layout keeps their `--! per_key` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Assembly {
    PerKey,
    Packed,
}

impl Assembly {
    /// The scripts of `layout`.
    pub(super) fn of(layout: Layout) -> Self {
        match layout {
            Layout::PerKey => Assembly::PerKey,
            Layout::Packed(_) => Assembly::Packed,
        }
    }

    /// Index into the script tables.
    const fn index(self) -> usize {
        match self {
            Assembly::PerKey => 0,
            Assembly::Packed => 1,
        }
    }

    /// The load and commit sections of `algorithm` packed, when this
    /// assembly packs it.
    fn packed(self, algorithm: Algorithm) -> Option<&'static str> {
        match (self, algorithm) {
            (Assembly::Packed, Algorithm::SlidingWindowCounter) => {
                Some(include_str!("sliding_window_counter_packed.lua"))
            }
            (Assembly::Packed, Algorithm::FixedWindow) => Some(include_str!("fixed_window_packed.lua")),
            _ => None,
        }
    }
}

/// What the Redis store knows of an algorithm: its Lua mirror and its tag
/// in keys. Implemented here for each algorithm's unit type, so the
/// algorithms know nothing of Redis; [`tag`] and [`lua`] are built from
/// `for_each_algorithm!` through this trait, and an algorithm without an
/// implementation is a compile error.
pub(super) trait Scripted: Definition {
    /// Its short name in Redis keys (`…:<TAG>:<limit>:<window_ms>`) and in
    /// the names of its Lua functions. Part of the key layout: changing it
    /// orphans every key already written.
    const TAG: &'static str;
    /// Its Lua mirror (`<NAME>.lua` beside this file), which follows the
    /// load / decide / commit contract below.
    const LUA: &'static str;
}

impl Scripted for SlidingWindowCounter {
    const TAG: &'static str = "swc";
    const LUA: &'static str = include_str!("sliding_window_counter.lua");
}

impl Scripted for FixedWindow {
    const TAG: &'static str = "fw";
    const LUA: &'static str = include_str!("fixed_window.lua");
}

impl Scripted for SlidingLog {
    const TAG: &'static str = "log";
    const LUA: &'static str = include_str!("sliding_log.lua");
}

impl Scripted for TokenBucket {
    const TAG: &'static str = "tb";
    const LUA: &'static str = include_str!("token_bucket.lua");
}

impl Scripted for Gcra {
    const TAG: &'static str = "gcra";
    const LUA: &'static str = include_str!("gcra.lua");
}

/// [`Scripted`] by [`Algorithm`]: `tag` and `lua`.
macro_rules! scripted {
    ($($variant:ident => $module:ident),* $(,)?) => {
        /// The algorithm's [`Scripted::TAG`].
        pub(super) fn tag(algorithm: Algorithm) -> &'static str {
            match algorithm {
                $(Algorithm::$variant => <crate::algorithm::$module::$variant as Scripted>::TAG,)*
            }
        }

        /// The algorithm's [`Scripted::LUA`].
        fn lua(algorithm: Algorithm) -> &'static str {
            match algorithm {
                $(Algorithm::$variant => <crate::algorithm::$module::$variant as Scripted>::LUA,)*
            }
        }
    };
}

for_each_algorithm!(scripted);

const PRELUDE: &str = include_str!("prelude.lua");
const DEADLINE: &str = include_str!("deadline.lua");
const DECIDE: &str = include_str!("decide.lua");
const DECIDE_ALL: &str = include_str!("decide_all.lua");
const LEASE: &str = include_str!("lease.lua");
const PENALTY: &str = include_str!("penalty.lua");

/// An algorithm's number in `decide_all.lua`'s ARGV: its place in
/// [`Algorithm::ALL`], from 1, as in the table [`dispatch_table`] writes.
pub(super) fn number(algorithm: Algorithm) -> usize {
    index(algorithm) + 1
}

/// The algorithm's place in [`Algorithm::ALL`].
fn index(algorithm: Algorithm) -> usize {
    Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap_or_default()
}

/// An algorithm file split along the contract's markers.
struct Sections {
    comment: &'static str,
    state: &'static str,
    charged: &'static str,
    load: &'static str,
    decide: &'static str,
    commit: &'static str,
    keep: &'static str,
}

/// The `keep` of a state in one key: in client time, a state that matters
/// `reset` ms more (0: idle) keeps its key exactly that long plus the slack,
/// after any decision, a denial too. The window states' in-place writes
/// keep the TTL of their window's first write, too short once the clock
/// stepped back; and a TTL lengthened while the clock was behind is too
/// long once it has caught up (Redis's clock never saw the step), so the
/// TTL is set, not only lengthened: it then never exceeds the state's life,
/// the slack and how far the clock is behind the latest time it showed. A
/// missing key (-2) is not created, a key without expiry (-1, no decision
/// wrote it) left alone, a TTL already right (a key just written whole)
/// not written again.
const KEEP: &str = "\
local want = reset + CLIENT_TTL_SLACK_MS
local ttl = call('PTTL', key)
if ttl >= 0 and ttl ~= want then
  call('PEXPIRE', key, format('%d', want))
end
";

impl Sections {
    fn of(algorithm: Algorithm, assembly: Assembly) -> Self {
        let source = lua(algorithm);
        let name = algorithm.name();
        let cut = |text: &'static str, marker: &str| {
            text.split_once(marker).unwrap_or_else(|| panic!("{name}.lua has no {marker:?}"))
        };
        let (comment, rest) = cut(source, "--! state ");
        let (state, rest) = cut(rest, "\n--! charged ");
        let (charged, rest) = cut(rest, "\n");
        let (_, rest) = cut(rest, "--! load\n");
        let (load, rest) = cut(rest, "--! decide\n");
        let (decide, rest) = cut(rest, "--! commit\n");
        let (commit, keep) = rest.split_once("--! keep\n").unwrap_or((rest, KEEP));
        match assembly.packed(algorithm) {
            None => Sections { comment, state, charged, load, decide, commit, keep },
            Some(packed) => {
                let (packed_comment, rest) = cut(packed, "--! load\n");
                let (load, rest) = cut(rest, "--! commit\n");
                let (commit, keep) = cut(rest, "--! keep\n");
                Sections { comment: packed_comment, state, charged, load, decide, commit, keep }
            }
        }
    }

    /// The four functions `decide_all.lua` dispatches to, named after the
    /// algorithm's key tag: `<tag>_load(key, limit, w)` returns the state,
    /// `<tag>_decide(cost, limit, w, state…)` returns the decision and the
    /// charged state, `<tag>_commit(key, limit, w, cost, charged…)` writes,
    /// `<tag>_keep(key, w, reset)` keeps the key alive in client time.
    fn functions(&self, tag: &str) -> String {
        let Sections { comment, state, charged, load, decide, commit, keep } = self;
        let (load, decide, commit, keep) = (indent(load), indent(decide), indent(commit), indent(keep));
        format!(
            "{comment}local function {tag}_load(key, limit, w)\n  local {state}\n{load}  return {state}\nend\n\n\
             local function {tag}_decide(cost, limit, w, {state})\n  local allowed, remaining, reset, retry, {charged}\n\
             {decide}  return allowed, remaining, reset, retry, {charged}\nend\n\n\
             local function {tag}_commit(key, limit, w, cost, {charged})\n{commit}end\n\n\
             local function {tag}_keep(key, w, reset)\n{keep}end\n"
        )
    }

    /// The sections in a row, for one limit at `key`: afterwards `allowed,
    /// remaining, reset, retry` hold the decision, charged when allowed.
    fn inline(&self) -> String {
        let Sections { comment, state, charged, load, decide, commit, keep } = self;
        let (load, decide, commit, keep) = (indent(load), indent(decide), indent(commit), indent(keep));
        format!(
            "{comment}local {state}\ndo\n{load}end\n\
             local allowed, remaining, reset, retry, {charged}\ndo\n{decide}end\n\
             if allowed and cost > 0 then\n{commit}end\n\
             if client_time then\n{keep}end\n"
        )
    }
}

/// `code` indented by two spaces, blank lines left empty and trailing
/// blank lines dropped.
fn indent(code: &str) -> String {
    let mut out = String::with_capacity(code.len() + code.len() / 8);
    for line in code.trim_end().lines() {
        if !line.is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The algorithm a piece's file name (`<name>.lua`) names.
fn algorithm_file(name: &str) -> Algorithm {
    Algorithm::ALL
        .into_iter()
        .find(|a| name.strip_suffix(".lua") == Some(a.name()))
        .unwrap_or_else(|| panic!("a script includes {name}, which is not an algorithm"))
}

/// Every algorithm's functions, then `algorithms`: the table
/// `decide_all.lua` dispatches on, indexed by [`number`].
fn dispatch_table(assembly: Assembly) -> String {
    let mut lua = String::new();
    for a in Algorithm::ALL {
        lua.push_str(&Sections::of(a, assembly).functions(tag(a)));
        lua.push('\n');
    }
    lua.push_str("local algorithms = {\n");
    for a in Algorithm::ALL {
        lua.push_str(&format!(
            "  {{ load = {t}_load, decide = {t}_decide, commit = {t}_commit, keep = {t}_keep }}, -- {n} {name}\n",
            t = tag(a),
            n = number(a),
            name = a.name()
        ));
    }
    lua.push_str("}\n");
    lua
}

/// Replaces each `--! include prelude.lua` line of `main` with the prelude
/// (`--! include deadline.lua` with the clock and deadline of a script
/// that decides nothing) and each `--! inline <name>.lua` line with that algorithm's sections;
/// keeps the code of `--! packed <code>` lines in the packed assembly and
/// of `--! per_key <code>` lines in the other (indented as the directive).
fn assemble(main: &str, assembly: Assembly) -> String {
    let mut script = String::with_capacity(main.len() * 2 + PRELUDE.len());
    for line in main.split_inclusive('\n') {
        let directive = line.trim();
        let indent = &line[..line.len() - line.trim_start().len()];
        let kept = match assembly {
            Assembly::Packed => {
                (directive.strip_prefix("--! packed "), directive.starts_with("--! per_key "))
            }
            Assembly::PerKey => {
                (directive.strip_prefix("--! per_key "), directive.starts_with("--! packed "))
            }
        };
        if let (Some(code), _) = kept {
            script.push_str(indent);
            script.push_str(code);
            script.push('\n');
        } else if kept.1 {
            // The other layout's line.
        } else if directive == "--! include prelude.lua" {
            script.push_str(PRELUDE);
        } else if directive == "--! include deadline.lua" {
            script.push_str(DEADLINE);
        } else if let Some(name) = directive.strip_prefix("--! inline ") {
            script.push_str(&Sections::of(algorithm_file(name), assembly).inline());
        } else {
            assert!(!directive.starts_with("--! "), "unknown directive {directive:?}");
            script.push_str(line);
        }
    }
    script
}

/// A script that decides nothing, with its `--! include deadline.lua`.
fn standalone(main: &str) -> String {
    assemble(main, Assembly::PerKey)
}

/// The source of the single-limit script for `algorithm`.
pub(super) fn decide_source(algorithm: Algorithm, assembly: Assembly) -> String {
    assemble(&DECIDE.replace("ALGORITHM", algorithm.name()).replace("TAG", tag(algorithm)), assembly)
}

/// The source of the lease script for `algorithm`: `decide.lua`'s
/// decision, answering the window charged too (`lease.lua`).
pub(super) fn lease_source(algorithm: Algorithm, assembly: Assembly) -> String {
    assemble(&LEASE.replace("ALGORITHM", algorithm.name()).replace("TAG", tag(algorithm)), assembly)
}

/// The source of the all-or-nothing script over several limits.
pub(super) fn decide_all_source(assembly: Assembly) -> String {
    assemble(&DECIDE_ALL.replace("--! algorithms\n", &dispatch_table(assembly)), assembly)
}

/// The source of `decide_all.lua` inside the penalty box: `penalty.lua`'s
/// comment block, then `decide_all.lua` with the `head` part after the
/// algorithms, its limit loop bounded by the `limits` part (the last key is
/// the penalty's), and its final `return` replaced by the `tail` part.
pub(super) fn penalty_source(assembly: Assembly) -> String {
    let (comment, parts) = PENALTY.split_once("--! part head\n").expect("penalty.lua has a head part");
    let (head, parts) = parts.split_once("--! part limits\n").expect("penalty.lua has a limits part");
    let (limits, tail) = parts.split_once("--! part tail\n").expect("penalty.lua has a tail part");
    let splice = |text: &str, from: &str, to: &str| {
        assert_eq!(text.matches(from).count(), 1, "decide_all.lua has one {from:?}");
        text.replace(from, to)
    };
    let main = splice(DECIDE_ALL, "--! algorithms\n", &format!("{}{head}", dispatch_table(assembly)));
    let main = splice(&main, "for i = 1, #KEYS do", &format!("for i = 1, {} do", limits.trim()));
    let main = splice(&main, "return table.concat(reply)\n", tail);
    format!("{comment}{}", assemble(&main, assembly))
}

/// A script with its source: `EVALSHA` needs the hash, and the fallback
/// after a `NOSCRIPT` sends the source with `EVAL`.
pub(super) struct Lua {
    script: Script,
    source: String,
}

impl Lua {
    fn new(source: String) -> Self {
        Self { script: Script::new(&source), source }
    }

    /// The SHA1 `EVALSHA` names the script by.
    pub(super) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The Lua source, for `EVAL` and `SCRIPT LOAD`.
    pub(super) fn source(&self) -> &str {
        &self.source
    }
}

struct Scripts {
    /// Indexed like [`Algorithm::ALL`].
    decide: [Lua; Algorithm::ALL.len()],
    decide_all: Lua,
    penalty: Lua,
}

impl Scripts {
    fn new(assembly: Assembly) -> Self {
        Scripts {
            decide: Algorithm::ALL.map(|a| Lua::new(decide_source(a, assembly))),
            decide_all: Lua::new(decide_all_source(assembly)),
            penalty: Lua::new(penalty_source(assembly)),
        }
    }
}

/// Per [`Assembly::index`].
static SCRIPTS: [LazyLock<Scripts>; 2] =
    [LazyLock::new(|| Scripts::new(Assembly::PerKey)), LazyLock::new(|| Scripts::new(Assembly::Packed))];

/// The script deciding one limit of `algorithm`.
pub(super) fn decide(algorithm: Algorithm, assembly: Assembly) -> &'static Lua {
    &SCRIPTS[assembly.index()].decide[index(algorithm)]
}

/// The script deciding several limits all-or-nothing.
pub(super) fn decide_all(assembly: Assembly) -> &'static Lua {
    &SCRIPTS[assembly.index()].decide_all
}

/// The distinct-values script (`distinct.lua`): standalone, without the
/// prelude, since it reads no packed state. Loaded by its first call's
/// `EVAL` fallback.
pub(super) fn distinct() -> &'static Lua {
    static DISTINCT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("distinct.lua").to_owned()));
    &DISTINCT
}

/// The layout record's script (`layout_record.lua`): standalone, loaded by
/// its first call's `EVAL` fallback.
pub(super) fn layout_record() -> &'static Lua {
    static RECORD: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("layout_record.lua").to_owned()));
    &RECORD
}

/// The shared tables' script (`table.lua`): standalone, loaded by its
/// first call's `EVAL` fallback.
pub(super) fn table() -> &'static Lua {
    static TABLE: LazyLock<Lua> = LazyLock::new(|| Lua::new(standalone(include_str!("table.lua"))));
    &TABLE
}

/// The script lifting an identity's penalty box (`lift.lua`).
pub(super) fn lift() -> &'static Lua {
    static LIFT: LazyLock<Lua> = LazyLock::new(|| Lua::new(standalone(include_str!("lift.lua"))));
    &LIFT
}

/// The script leasing permits of a limit of `algorithm`, for the algorithms
/// that are leased (`store::lease::leasable`); loaded by its first call's
/// `EVAL` fallback.
pub(super) fn lease(algorithm: Algorithm, assembly: Assembly) -> Option<&'static Lua> {
    static LEASES: [LazyLock<[Lua; 2]>; 2] = [
        LazyLock::new(|| {
            [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow]
                .map(|a| Lua::new(lease_source(a, Assembly::PerKey)))
        }),
        LazyLock::new(|| {
            [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow]
                .map(|a| Lua::new(lease_source(a, Assembly::Packed)))
        }),
    ];
    let leases = &LEASES[assembly.index()];
    match algorithm {
        Algorithm::SlidingWindowCounter => Some(&leases[0]),
        Algorithm::FixedWindow => Some(&leases[1]),
        Algorithm::SlidingLog | Algorithm::TokenBucket | Algorithm::Gcra => None,
    }
}

/// The script giving a lease's unused permits back (`give_back.lua`, or
/// `give_back_packed.lua`): standalone, loaded by its first call's `EVAL`
/// fallback.
pub(super) fn give_back(assembly: Assembly) -> &'static Lua {
    static GIVE_BACK: [LazyLock<Lua>; 2] = [
        LazyLock::new(|| Lua::new(standalone(include_str!("give_back.lua")))),
        LazyLock::new(|| Lua::new(standalone(include_str!("give_back_packed.lua")))),
    ];
    &GIVE_BACK[assembly.index()]
}

/// The script deciding several limits inside the penalty box.
pub(super) fn penalty(assembly: Assembly) -> &'static Lua {
    &SCRIPTS[assembly.index()].penalty
}

/// Every script of `assembly` that decides, to load them all when connecting.
pub(super) fn all(assembly: Assembly) -> impl Iterator<Item = &'static Lua> {
    let scripts = &*SCRIPTS[assembly.index()];
    scripts.decide.iter().chain([&scripts.decide_all, &scripts.penalty])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lua` without its comments (no string in the scripts holds "--").
    fn code(lua: &str) -> String {
        lua.lines().map(|line| line.split("--").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn scripts_start_with_their_comment_block_and_include_every_piece() {
        for assembly in [Assembly::PerKey, Assembly::Packed] {
            for a in Algorithm::ALL {
                let source = decide_source(a, assembly);
                assert!(source.starts_with(&format!("-- slidegate decide, {}:", a.name())), "{source}");
                assert!(source.contains("-- ARGV[1]"));
                assert!(
                    source.contains(&format!("local {}\ndo\n", Sections::of(a, assembly).state)),
                    "{source}"
                );
                assert!(!source.contains("--! "));
                // One flat chunk: nothing for Lua to allocate a closure for.
                assert!(!code(&source).contains("function"), "{source}");
                let packed = assembly.packed(a).is_some();
                assert_eq!(code(&source).contains("HGET"), packed, "{source}");
                assert_eq!(
                    code(&source).contains("local field, window_key = ARGV[2], nil"),
                    assembly == Assembly::Packed
                );
            }
            for a in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
                let source = lease_source(a, assembly);
                assert!(source.starts_with(&format!("-- slidegate lease, {}:", a.name())), "{source}");
                assert!(!source.contains("--! ") && !code(&source).contains("function"), "{source}");
                assert_eq!(code(&source).matches("return struct_pack").count(), 1, "{source}");
            }
            let all = decide_all_source(assembly);
            assert!(all.starts_with("-- slidegate decide_all:"));
            assert!(!all.contains("--! "));
            let penalty = penalty_source(assembly);
            assert!(penalty.starts_with("-- slidegate decide_penalized:"));
            assert!(!penalty.contains("--! "));
            assert!(penalty.contains("for i = 1, #KEYS - 1 do"));
            assert!(penalty.contains("return table.concat(reply) .. struct_pack('<d', blocked)"));
            for a in Algorithm::ALL {
                assert!(all.contains(&format!("local function {}_commit(key, limit, w, cost, ", tag(a))));
            }
            assert_eq!(all.matches("field = string.sub(fields").count(), assembly.index());
            assert_eq!(all.matches("field, window_key = string.sub(fields").count(), assembly.index());
        }
    }

    #[test]
    fn algorithm_files_keep_the_contract() {
        let names = |list: &str| list.split(", ").map(str::to_owned).collect::<Vec<_>>();
        for (a, assembly) in
            Algorithm::ALL.into_iter().flat_map(|a| [(a, Assembly::PerKey), (a, Assembly::Packed)])
        {
            let s = Sections::of(a, assembly);
            let (state, charged) = (names(s.state), names(s.charged));
            assert!((1..=3).contains(&state.len()) && (1..=4).contains(&charged.len()), "{}", a.name());
            assert!(state.iter().all(|n| !charged.contains(n)), "{}: state and charged overlap", a.name());
            for body in [s.load, s.decide, s.commit, s.keep] {
                let code = code(body);
                assert!(!code.contains("return") && !code.contains("function"), "{}: {body}", a.name());
                assert!(!body.contains("--!"), "{}: {body}", a.name());
            }
        }
    }

    #[test]
    fn the_dispatch_table_numbers_algorithms_as_the_wire_does() {
        let all = decide_all_source(Assembly::PerKey);
        let table = &all[all.find("local algorithms = {").expect("the table is generated")..];
        let entries: Vec<&str> = table.lines().skip(1).take_while(|l| *l != "}").collect();
        assert_eq!(entries.len(), Algorithm::ALL.len());
        for (i, (a, entry)) in Algorithm::ALL.into_iter().zip(entries).enumerate() {
            // The numbers existing clients send: 1 sliding window counter … 5 gcra.
            assert_eq!(number(a), i + 1);
            assert!(entry.contains(&format!("decide = {}_decide", tag(a))), "{entry}");
            assert!(entry.ends_with(&format!("-- {} {}", i + 1, a.name())), "{entry}");
        }
        assert_eq!(
            Algorithm::ALL.map(number),
            [1, 2, 3, 4, 5],
            "sliding_window_counter, fixed_window, sliding_log, token_bucket, gcra"
        );
    }

    #[test]
    fn single_scripts_carry_only_their_own_algorithm() {
        let swc = decide_source(Algorithm::SlidingWindowCounter, Assembly::PerKey);
        assert!(!swc.contains("gcra_decide") && !swc.contains("ZADD"));
    }
}
