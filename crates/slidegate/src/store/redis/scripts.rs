//! The Lua scripts, assembled once from the `*.lua` pieces beside this file.
//!
//! Each algorithm's arithmetic exists once in Lua, in `<name>.lua`
//! (mirroring `crate::algorithm::<name>`, whose `Definition` supplies the
//! source). A script is a main file whose `--! include <file>` lines pull in
//! the shared `prelude.lua` (arguments, clock, exact division, TTL) and the
//! algorithm files: `decide.lua` once per algorithm (its `ALGORITHM` / `TAG`
//! placeholders filled in), `decide_all.lua` with every algorithm, whose
//! `--! algorithms` line becomes their files and the dispatch table built
//! from [`Algorithm::ALL`]. Scripts start with the main file's comment
//! block, which gives KEYS, ARGV and the reply.
//!
//! # The contract of an algorithm file
//!
//! `<name>.lua` defines three local functions named after the algorithm's
//! key tag (`swc`, `fw`, …), and nothing else the main files rely on:
//!
//! - `<tag>_load(key, limit, w)` reads the identity's state and returns it
//!   as up to three values `s1, s2, s3` (a missing key reads as a fresh
//!   identity). It only reads.
//! - `<tag>_decide(cost, limit, w, s1, s2, s3)` decides `cost` permits at
//!   the prelude's `now` on that state and returns `allowed, remaining,
//!   reset_after, retry_after` (ms; retry_after -1 when allowed), then up to
//!   four values `n1 … n4` describing the state after charging. It writes
//!   nothing (it may read more of the key, as the sliding log does) and is
//!   also called with cost 0 to peek.
//! - `<tag>_commit(key, limit, w, cost, n1, n2, n3, n4)` writes the charged
//!   state and sets the key's TTL in the same write. It is called only when
//!   the decision allowed a cost above 0.
//!
//! `limit`, `w` (the window in ms) and `cost` are integers below 2^53, as
//! are all values in the state; arithmetic follows the prelude's rules.

use std::sync::LazyLock;

use redis::Script;

use crate::Algorithm;

const PRELUDE: &str = include_str!("prelude.lua");
const DECIDE: &str = include_str!("decide.lua");
const DECIDE_ALL: &str = include_str!("decide_all.lua");
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

/// The piece `--! include <name>` stands for.
fn piece(name: &str) -> &'static str {
    if name == "prelude.lua" {
        return PRELUDE;
    }
    Algorithm::ALL
        .into_iter()
        .find(|a| name.strip_suffix(".lua") == Some(a.name()))
        .map(Algorithm::lua)
        .unwrap_or_else(|| panic!("a script includes {name}, which is not a known piece"))
}

/// Every algorithm file, then `algorithms`: the table `decide_all.lua`
/// dispatches on, indexed by [`number`].
fn dispatch_table() -> String {
    let mut lua = String::new();
    for a in Algorithm::ALL {
        lua.push_str(&format!(
            "--! include {}.lua
",
            a.name()
        ));
    }
    lua.push_str(
        "
local algorithms = {
",
    );
    for a in Algorithm::ALL {
        lua.push_str(&format!(
            "  {{ load = {t}_load, decide = {t}_decide, commit = {t}_commit }}, -- {n} {name}\n",
            t = a.tag(),
            n = number(a),
            name = a.name()
        ));
    }
    lua.push_str("}\n");
    lua
}

/// Replaces each `--! include <file>` line of `main` with that piece.
fn assemble(main: &str) -> String {
    let mut script = String::with_capacity(main.len() * 2 + PRELUDE.len());
    for line in main.split_inclusive('\n') {
        match line.trim_end().strip_prefix("--! include ") {
            Some(name) => script.push_str(piece(name)),
            None => script.push_str(line),
        }
    }
    script
}

/// The source of the single-limit script for `algorithm`.
pub(super) fn decide_source(algorithm: Algorithm) -> String {
    assemble(&DECIDE.replace("ALGORITHM", algorithm.name()).replace("TAG", algorithm.tag()))
}

/// The source of the all-or-nothing script over several limits.
pub(super) fn decide_all_source() -> String {
    assemble(&DECIDE_ALL.replace("--! algorithms\n", &dispatch_table()))
}

/// The source of `decide_all.lua` inside the penalty box: `penalty.lua`'s
/// comment block, then `decide_all.lua` with the `head` part after the
/// algorithms, its limit loop bounded by the `limits` part (the last key is
/// the penalty's), and its final `return` replaced by the `tail` part.
pub(super) fn penalty_source() -> String {
    let (comment, parts) = PENALTY.split_once("--! part head\n").expect("penalty.lua has a head part");
    let (head, parts) = parts.split_once("--! part limits\n").expect("penalty.lua has a limits part");
    let (limits, tail) = parts.split_once("--! part tail\n").expect("penalty.lua has a tail part");
    let splice = |text: &str, from: &str, to: &str| {
        assert_eq!(text.matches(from).count(), 1, "decide_all.lua has one {from:?}");
        text.replace(from, to)
    };
    let main = splice(DECIDE_ALL, "--! algorithms\n", &format!("{}{head}", dispatch_table()));
    let main = splice(&main, "for i = 1, #KEYS do", &format!("for i = 1, {} do", limits.trim()));
    let main = splice(&main, "return table.concat(reply)\n", tail);
    format!("{comment}{}", assemble(&main))
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

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    decide: Algorithm::ALL.map(|a| Lua::new(decide_source(a))),
    decide_all: Lua::new(decide_all_source()),
    penalty: Lua::new(penalty_source()),
});

/// The script deciding one limit of `algorithm`.
pub(super) fn decide(algorithm: Algorithm) -> &'static Lua {
    &SCRIPTS.decide[index(algorithm)]
}

/// The script deciding several limits all-or-nothing.
pub(super) fn decide_all() -> &'static Lua {
    &SCRIPTS.decide_all
}

/// The distinct-values script (`distinct.lua`): standalone, without the
/// prelude, since it reads no packed state. Loaded by its first call's
/// `EVAL` fallback.
pub(super) fn distinct() -> &'static Lua {
    static DISTINCT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("distinct.lua").to_owned()));
    &DISTINCT
}

/// The script deciding several limits inside the penalty box.
pub(super) fn penalty() -> &'static Lua {
    &SCRIPTS.penalty
}

/// Every script, to load them all when connecting.
pub(super) fn all() -> impl Iterator<Item = &'static Lua> {
    SCRIPTS.decide.iter().chain([&SCRIPTS.decide_all, &SCRIPTS.penalty])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_start_with_their_comment_block_and_include_every_piece() {
        for a in Algorithm::ALL {
            let source = decide_source(a);
            assert!(source.starts_with(&format!("-- slidegate decide, {}:", a.name())), "{source}");
            assert!(source.contains("-- ARGV[1]"));
            assert!(source.contains(&format!(
                "local load, decide, commit = {t}_load, {t}_decide, {t}_commit",
                t = a.tag()
            )));
            assert!(!source.contains("--! "));
            assert!(source.contains(&format!("local function {}_decide(", a.tag())));
        }
        let all = decide_all_source();
        assert!(all.starts_with("-- slidegate decide_all:"));
        assert!(!all.contains("--! "));
        let penalty = penalty_source();
        assert!(penalty.starts_with("-- slidegate decide_penalized:"));
        assert!(!penalty.contains("--! "));
        assert!(penalty.contains("for i = 1, #KEYS - 1 do"));
        assert!(penalty.contains("return table.concat(reply) .. struct_pack('<d', blocked)"));
        for a in Algorithm::ALL {
            assert!(all.contains(&format!("local function {}_commit(", a.tag())));
        }
    }

    #[test]
    fn the_dispatch_table_numbers_algorithms_as_the_wire_does() {
        let all = decide_all_source();
        let table = &all[all.find("local algorithms = {").expect("the table is generated")..];
        let entries: Vec<&str> = table.lines().skip(1).take_while(|l| *l != "}").collect();
        assert_eq!(entries.len(), Algorithm::ALL.len());
        for (i, (a, entry)) in Algorithm::ALL.into_iter().zip(entries).enumerate() {
            // The numbers existing clients send: 1 sliding window counter … 5 gcra.
            assert_eq!(number(a), i + 1);
            assert!(entry.contains(&format!("decide = {}_decide", a.tag())), "{entry}");
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
        let swc = decide_source(Algorithm::SlidingWindowCounter);
        assert!(!swc.contains("gcra_decide") && !swc.contains("ZADD"));
    }
}
