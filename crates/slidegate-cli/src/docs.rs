//! `slidegate completions SHELL` and `slidegate man`: shell completions and
//! a man page, generated from the argument definitions, so they never lag
//! behind the commands. Both print to stdout, for a package to install:
//!
//! ```sh
//! slidegate completions bash > /usr/share/bash-completion/completions/slidegate
//! slidegate man > /usr/share/man/man1/slidegate.1
//! slidegate man serve > /usr/share/man/man1/slidegate-serve.1   # one per subcommand
//! slidegate man --out-dir /usr/share/man/man1                    # every page at once
//! ```

use std::process::ExitCode;

/// Arguments of `slidegate completions`.
#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

/// The shells completions are generated for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Arguments of `slidegate man`.
#[derive(clap::Args)]
pub struct ManArgs {
    /// The subcommand whose page to print (`slidegate-COMMAND(1)`; `identity hash` for
    /// `slidegate-identity-hash(1)`); without one, the main page.
    #[arg(value_name = "COMMAND", conflicts_with = "out_dir")]
    command: Vec<String>,
    /// Write every page (`slidegate.1` and one `slidegate-COMMAND.1` per
    /// subcommand, nested ones included) into this existing directory instead.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<std::path::PathBuf>,
}

/// Runs `slidegate completions` for `command`, the whole command line's definition.
pub fn completions(args: CompletionsArgs, mut command: clap::Command) -> crate::exit::CommandResult {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "slidegate", &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    Ok(ExitCode::SUCCESS)
}

/// Runs `slidegate man`: the page of `slidegate`, whose SUBCOMMANDS
/// section refers to `slidegate-COMMAND(1)`, or that page of a subcommand;
/// `root` is the whole command line's definition.
pub fn man(args: ManArgs, mut root: clap::Command) -> crate::exit::CommandResult {
    let mut command = root.clone();
    // Gives each subcommand its display name, `slidegate-COMMAND`.
    command.build();
    if let Some(dir) = args.out_dir {
        return write_pages(&command, &dir);
    }
    let mut page = command;
    for name in &args.command {
        let Some(sub) = page.find_subcommand(name) else {
            let names: Vec<&str> = page.get_subcommands().map(|c| c.get_name()).collect();
            let message = if names.is_empty() {
                format!("{} has no subcommand {name:?}", page.get_display_name().unwrap_or("slidegate"))
            } else {
                format!("no subcommand {name:?}: expected one of {}", names.join(", "))
            };
            root.error(clap::error::ErrorKind::InvalidValue, message).exit();
        };
        page = sub.clone().version(env!("CARGO_PKG_VERSION"));
    }
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).render(&mut roff)?;
    out!("{}", String::from_utf8_lossy(&roff));
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `command` and of each of its subcommands, depth first,
/// into `dir` as `DISPLAY-NAME.1`, naming each file written on stdout.
fn write_pages(command: &clap::Command, dir: &std::path::Path) -> crate::exit::CommandResult {
    if !dir.is_dir() {
        return Err(format!("--out-dir {}: not an existing directory", dir.display()).into());
    }
    let mut pending = vec![command.clone()];
    while let Some(page) = pending.pop() {
        pending.extend(page.get_subcommands().filter(|sub| sub.get_name() != "help").cloned());
        let name = page.get_display_name().unwrap_or("slidegate").to_string();
        let mut roff = Vec::new();
        clap_mangen::Man::new(page.version(env!("CARGO_PKG_VERSION"))).render(&mut roff)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, roff).map_err(|err| format!("{}: {err}", path.display()))?;
        outln!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
