//! `slidegate bench` (not built yet).

use std::process::ExitCode;

/// Arguments of `slidegate bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Runs `slidegate bench`.
pub fn run(_args: BenchArgs) -> crate::CommandResult {
    eprintln!("slidegate bench is not built yet");
    Ok(ExitCode::FAILURE)
}
