//! The `slidegate` command: parses arguments and prints. The logic a library
//! user would also need lives in the `slidegate` and `slidegate-http` crates.

// What the commands share: printing (first, for its macros), the result and
// exit codes, argument parsers, and the helpers the Redis commands use.
#[macro_use]
mod stdout;
mod args;
mod exit;
mod heap;
mod heap_trim;
mod plot;
mod redis_errors;
mod redis_info;
mod redis_keys;
mod redis_nodes;
mod reference_script;
mod watch;

// The commands, one module each (`bench` a folder, its targets its
// children): only `main` dispatches to them, and none imports another or
// this file (`scripts/check-architecture`).
mod accuracy;
mod bench;
mod demo;
mod docs;
mod identity;
mod replay;
mod serve;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// slidegate: a sliding-window rate limiter, embedded or on Redis.
#[derive(Parser)]
#[command(name = "slidegate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reproduce the source article's experiments: boundary burst and memory per identity.
    Demo(demo::DemoArgs),
    /// Measure decision throughput, latency and server cost.
    Bench(bench::BenchArgs),
    /// Replay synthetic traffic through every algorithm against an exact log.
    Accuracy(accuracy::AccuracyArgs),
    /// Run the rate-limiting reverse proxy and decision API.
    Serve(serve::ServeArgs),
    /// Validate a configuration file.
    CheckConfig(serve::CheckConfigArgs),
    /// Replay recorded access logs through a configuration's rules, on a simulated clock.
    Replay(replay::ReplayArgs),
    /// Identities as serve keeps them: `identity hash` prints an API key's or an IP's hash.
    Identity(identity::IdentityArgs),
    /// Print shell completions (bash, zsh or fish), generated from these definitions.
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff), generated from these definitions.
    Man(docs::ManArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Accuracy(args) => accuracy::run(args),
        Command::Serve(args) => serve::run(args),
        Command::CheckConfig(args) => serve::check_config(args),
        Command::Replay(args) => replay::run(args),
        Command::Identity(args) => identity::run(args),
        Command::Completions(args) => docs::completions(args, Cli::command()),
        Command::Man(args) => docs::man(args, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("slidegate: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The system allocator; it counts bytes only while `demo` measures (`heap.rs`).
#[global_allocator]
static ALLOCATOR: heap::CountingAllocator = heap::CountingAllocator;
