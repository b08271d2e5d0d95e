//! `slidegate serve` and `slidegate check-config` (not built yet).

use std::process::ExitCode;

/// Arguments of `slidegate serve`.
#[derive(clap::Args)]
pub struct ServeArgs {}

/// Arguments of `slidegate check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {}

/// Runs `slidegate serve`.
pub fn run(_args: ServeArgs) -> crate::CommandResult {
    eprintln!("slidegate serve is not built yet");
    Ok(ExitCode::FAILURE)
}

/// Runs `slidegate check-config`.
pub fn check_config(_args: CheckConfigArgs) -> crate::CommandResult {
    eprintln!("slidegate check-config is not built yet");
    Ok(ExitCode::FAILURE)
}
