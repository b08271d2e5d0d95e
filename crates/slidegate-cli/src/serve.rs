//! `slidegate serve` and `slidegate check-config`: load the config, print,
//! and hand over to `slidegate_server::serve`.
//!
//! What only a process does — installing the log subscriber, turning signals
//! into a shutdown — is done here; the library's [`Server`] takes the
//! shutdown as a future from its caller.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use slidegate_http::config::{LimitConfig, RuleLimits};
use slidegate_server::{Config, ConfigError, Server};

/// Arguments of `slidegate serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
}

/// Arguments of `slidegate check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    /// The configuration file (TOML).
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// The configuration as `serve` needs it: `check-config` loads with this
/// too, so it says ok exactly when `serve` would start with the file.
fn load(path: &PathBuf) -> Result<Config, ExitCode> {
    Config::load_to_serve(path).map_err(|err: ConfigError| {
        eprintln!("slidegate: {err}");
        ExitCode::from(crate::EX_USAGE)
    })
}

/// Runs `slidegate serve`.
pub fn run(args: ServeArgs) -> crate::CommandResult {
    let config = match load(&args.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    if let Err(message) = init_logging(config.server.log_format) {
        eprintln!("slidegate: {message}");
        return Ok(ExitCode::from(crate::EX_USAGE));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        // Installed before the address is announced: a SIGTERM from then on stops gracefully.
        let shutdown = shutdown_signal();
        let server = Server::bind(&config).await?;
        let upstream = config.server.upstream.as_ref().map(ToString::to_string).unwrap_or_default();
        let store = config.store.describe();
        if let Some(admin) = server.admin_addr() {
            // Announced first: whoever waits for "listening on" knows both.
            eprintln!("slidegate: admin endpoints on {admin}");
        } else if !config.server.admin_on_public {
            eprintln!(
                "slidegate: admin endpoints off: set [server] admin_listen or admin_on_public to serve them"
            );
        }
        eprintln!("slidegate: listening on {}, forwarding to {upstream}, store {store}", server.local_addr());
        server.run(shutdown).await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs `slidegate check-config`.
pub fn check_config(args: CheckConfigArgs) -> crate::CommandResult {
    let config = match load(&args.file) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    outln!("{}: ok", args.file.display());
    outln!(
        "  listen {}, upstream {}",
        config.server.listen,
        config.server.upstream.as_ref().map_or("(none)".into(), |u| u.to_string())
    );
    outln!("  store {}", config.store.describe());
    let prefix = &config.server.admin_prefix;
    match (config.server.admin_listen, config.server.admin_on_public) {
        (Some(addr), _) => outln!("  admin endpoints on {addr}"),
        (None, true) => outln!("  admin endpoints on the public listener under {prefix}/ (admin_on_public)"),
        (None, false) => outln!("  admin endpoints off (set admin_listen or admin_on_public)"),
    }
    if config.server.check_token.is_some() {
        outln!("  /v1/check requires a bearer token");
    }
    for rule in &config.limiter.rules {
        let methods = if rule.methods.is_empty() {
            "*".to_owned()
        } else {
            rule.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
        };
        let describe = |limits: &[LimitConfig]| {
            limits.iter().map(|l| format!("{} = {}", l.name, l.limit)).collect::<Vec<_>>().join("; ")
        };
        let limits = match &rule.limits {
            RuleLimits::Shared { limits, .. } => describe(limits),
            RuleLimits::Split { authenticated, anonymous } => {
                format!("authenticated: {}; anonymous: {}", describe(authenticated), describe(anonymous))
            }
            _ => String::new(),
        };
        outln!("  rule {} {methods} {}: {limits}", rule.name, rule.path);
    }
    Ok(ExitCode::SUCCESS)
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
///
/// The handlers are installed when this is called, not when the future is
/// first polled, so a signal that arrives while the server is busy is not lost
/// to the default action. Call it inside the runtime.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = term => {},
                () = int => {},
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received");
    }
}

/// Installs a log subscriber writing to stderr at the level in
/// `SLIDEGATE_LOG` (`error`, `warn`, `info`, `debug`, `trace`, `off`, or
/// 0–5 for off to trace, any case; default `info`), as text or one JSON
/// object a line (`[server] log_format`).
///
/// # Errors
/// A `SLIDEGATE_LOG` that is no level: the message to print. A typo such as
/// `SLIDEGATE_LOG=dbug` must not leave the operator at `info` unawares.
fn init_logging(format: slidegate_server::LogFormat) -> Result<(), String> {
    use tracing_subscriber::filter::LevelFilter;
    let level = match std::env::var("SLIDEGATE_LOG") {
        Err(std::env::VarError::NotPresent) => LevelFilter::INFO,
        Ok(value) => value.parse::<LevelFilter>().map_err(|_| {
            format!(
                "SLIDEGATE_LOG={value:?} is not a log level: expected error, warn, info, debug, trace or off"
            )
        })?,
        Err(std::env::VarError::NotUnicode(value)) => {
            return Err(format!(
                "SLIDEGATE_LOG={value:?} is not a log level: expected error, warn, info, debug, trace or off"
            ))
        }
    };
    let builder =
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level).with_target(false);
    // Another subscriber already installed (a test harness) is kept.
    let _ = match format {
        slidegate_server::LogFormat::Json => builder.json().try_init(),
        _ => builder.try_init(),
    };
    Ok(())
}
