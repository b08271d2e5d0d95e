//! What every command returns: its exit code, or an error that `main` prints
//! with exit code 1. Shared by the command modules, so that none of them
//! reaches back into `main.rs`.

use std::process::ExitCode;

/// EX_USAGE (sysexits.h): the command was used wrongly — a bad configuration,
/// or a target it refuses — as opposed to a failure while running (1).
pub const EX_USAGE: u8 = 64;

/// What a subcommand returns: its exit code, or an error to print.
pub type CommandResult = Result<ExitCode, Box<dyn std::error::Error>>;
