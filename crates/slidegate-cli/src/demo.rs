//! `slidegate demo` (being built).

use std::process::ExitCode;

/// Arguments of `slidegate demo`.
#[derive(clap::Args)]
pub struct DemoArgs {}

/// Runs `slidegate demo`.
pub fn run(_args: DemoArgs) -> crate::CommandResult {
    Ok(ExitCode::FAILURE)
}
