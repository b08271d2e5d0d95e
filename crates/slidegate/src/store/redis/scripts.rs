//! The Lua scripts, assembled once from the `*.lua` pieces beside this file.
//!
//! Each algorithm's arithmetic exists once in Lua (`<algorithm>.lua`, a
//! `load` / `decide` / `commit` triple mirroring `crate::algorithm`). A script
//! is a main file whose `--! include <file>` lines pull in the shared
//! `prelude.lua` (clock, exact division, TTL) and the algorithm files:
//! `decide.lua` once per algorithm (its `ALGORITHM` / `TAG` placeholders
//! filled in), `decide_all.lua` with all five. Scripts start with the main
//! file's comment block, which gives KEYS, ARGV and the reply.

use std::sync::LazyLock;

use redis::Script;

use super::key::tag;
use crate::Algorithm;

const PIECES: [(&str, &str); 6] = [
    ("prelude.lua", include_str!("prelude.lua")),
    ("sliding_window_counter.lua", include_str!("sliding_window_counter.lua")),
    ("fixed_window.lua", include_str!("fixed_window.lua")),
    ("sliding_log.lua", include_str!("sliding_log.lua")),
    ("token_bucket.lua", include_str!("token_bucket.lua")),
    ("gcra.lua", include_str!("gcra.lua")),
];
const DECIDE: &str = include_str!("decide.lua");
const DECIDE_ALL: &str = include_str!("decide_all.lua");

/// Replaces each `--! include <file>` line of `main` with that piece.
fn assemble(main: &str) -> String {
    let mut script = String::with_capacity(main.len() + PIECES.iter().map(|(_, p)| p.len()).sum::<usize>());
    for line in main.split_inclusive('\n') {
        match line.trim_end().strip_prefix("--! include ") {
            Some(name) => {
                let (_, piece) = PIECES
                    .iter()
                    .find(|(file, _)| *file == name)
                    .unwrap_or_else(|| panic!("a script includes {name}, which is not a known piece"));
                script.push_str(piece);
            }
            None => script.push_str(line),
        }
    }
    script
}

/// The source of the single-limit script for `algorithm`.
pub(super) fn decide_source(algorithm: Algorithm) -> String {
    assemble(&DECIDE.replace("ALGORITHM", algorithm.name()).replace("TAG", tag(algorithm)))
}

/// The source of the all-or-nothing script over several limits.
pub(super) fn decide_all_source() -> String {
    assemble(DECIDE_ALL)
}

struct Scripts {
    /// Indexed like [`Algorithm::ALL`].
    decide: [Script; 5],
    decide_all: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    decide: Algorithm::ALL.map(|a| Script::new(&decide_source(a))),
    decide_all: Script::new(&decide_all_source()),
});

/// The script deciding one limit of `algorithm`.
pub(super) fn decide(algorithm: Algorithm) -> &'static Script {
    let index = Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap_or_default();
    &SCRIPTS.decide[index]
}

/// The script deciding several limits all-or-nothing.
pub(super) fn decide_all() -> &'static Script {
    &SCRIPTS.decide_all
}

/// Every script, to load them all when connecting.
pub(super) fn all() -> impl Iterator<Item = &'static Script> {
    SCRIPTS.decide.iter().chain([&SCRIPTS.decide_all])
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
                t = tag(a)
            )));
            assert!(!source.contains("--! include"));
            assert!(source.contains(&format!("local function {}_decide(", tag(a))));
        }
        let all = decide_all_source();
        assert!(all.starts_with("-- slidegate decide_all:"));
        for a in Algorithm::ALL {
            assert!(all.contains(&format!("local function {}_commit(", tag(a))));
        }
    }

    #[test]
    fn single_scripts_carry_only_their_own_algorithm() {
        let swc = decide_source(Algorithm::SlidingWindowCounter);
        assert!(!swc.contains("gcra_decide") && !swc.contains("ZADD"));
    }
}
