//! The `slidegate` command: parses arguments and prints. The logic a library
//! user would also need lives in the `slidegate` and `slidegate-http` crates.

/// `print!` that ends the process quietly when stdout is closed early
/// (`slidegate accuracy | head`), as Unix tools do, instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*)) };
}

/// `println!` with the same broken-pipe behaviour as [`out!`].
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

mod accuracy;
mod args;
mod bench;
mod bench_attack;
mod bench_lease;
mod demo;
mod docs;
mod heap;
mod heap_trim;
mod identity;
mod plot;
mod redis_errors;
mod redis_info;
mod redis_keys;
mod redis_nodes;
mod reference_script;
mod replay;
mod serve;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
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

/// Writes to stdout; a reader that went away ends the process with success.
fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("slidegate: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// EX_USAGE (sysexits.h): the command was used wrongly — a bad configuration,
/// or a target it refuses — as opposed to a failure while running (1).
const EX_USAGE: u8 = 64;

/// What a subcommand returns: its exit code, or an error to print.
type CommandResult = Result<ExitCode, Box<dyn std::error::Error>>;
