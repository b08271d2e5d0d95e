//! What a hostile client tries against `slidegate serve`, each attack against
//! real processes and sockets: bypasses of the identity or the rules, the
//! admin surface, and the failure modes an attacker can provoke. Every test
//! here failed before the defence it checks was built.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod after_response;
mod breaker;
mod crawl;
mod identity;
mod offenders;
mod scrapers;
mod store_failures;
mod surface;
mod trickle;
