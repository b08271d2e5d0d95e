//! Printing for every command: `out!` and `outln!`, which end the process
//! quietly when stdout is closed early (`slidegate accuracy | head`), as Unix
//! tools do, instead of panicking as `print!` does.

/// `print!` that ends the process quietly when stdout is closed early.
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!($($arg)*)) };
}

/// `println!` with the same broken-pipe behaviour as [`out!`].
macro_rules! outln {
    () => { $crate::stdout::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Writes to stdout; a reader that went away ends the process with success.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("slidegate: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}
