//! `slidegate bench`: one target per child module — `redis_store`
//! (`bench redis`: decisions per second, latency and server cost of every
//! algorithm), `attack` (polite and abusive identities, with and without the
//! deny cache and the penalty box) and `lease` (quota leases off and on).
//! This module only dispatches; the targets import none of each other.

mod attack;
mod lease;
mod redis_store;

/// Arguments of `slidegate bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    target: Target,
}

#[derive(clap::Subcommand)]
enum Target {
    /// Drive decisions through the Redis store at full speed (loopback Redis only).
    Redis(redis_store::RedisArgs),
    /// Polite and abusive identities: store calls and Redis CPU per request
    /// with and without the deny cache and the penalty box (loopback Redis only).
    Attack(attack::AttackArgs),
    /// Quota leases: Redis calls and CPU per request for a hot identity and
    /// for ordinary ones, leases off and on, three instances (loopback Redis only).
    Lease(lease::LeaseArgs),
}

/// Runs `slidegate bench`.
pub fn run(args: BenchArgs) -> crate::exit::CommandResult {
    match args.target {
        Target::Redis(args) => redis_store::run(args),
        Target::Attack(args) => attack::run(args),
        Target::Lease(args) => lease::run(args),
    }
}
