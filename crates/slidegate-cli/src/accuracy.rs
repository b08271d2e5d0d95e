//! `slidegate accuracy` (not built yet).

use std::process::ExitCode;

/// Arguments of `slidegate accuracy`.
#[derive(clap::Args)]
pub struct AccuracyArgs {}

/// Runs `slidegate accuracy`.
pub fn run(_args: AccuracyArgs) -> crate::CommandResult {
    eprintln!("slidegate accuracy is not built yet");
    Ok(ExitCode::FAILURE)
}
