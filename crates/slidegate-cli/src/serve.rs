//! `slidegate serve` and `slidegate check-config`: load the config, print,
//! and hand over to `slidegate_server::serve`.
//!
//! What only a process does — installing the log subscriber, turning signals
//! into a shutdown or a reload — is done here; the library's [`Server`] takes
//! the shutdown as a future from its caller, and reloads through its
//! [`Reloader`] (on `SIGHUP`, and with `[server] watch_config` on a change
//! of the file: `watch.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use slidegate_http::config::{LimitConfig, RuleLimits};
use slidegate_server::{AccessLogReopen, Config, ConfigError, Reloader, Server};

/// Arguments of `slidegate serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
}

/// Arguments of `slidegate check-config`: `--config FILE` as `serve` takes
/// it, or the file alone (the first spelling, kept working).
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("file_given").required(true).args(["config", "file"]))]
pub struct CheckConfigArgs {
    /// The configuration file (TOML).
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The same, without `--config`.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
}

/// The configuration as `serve` needs it: `check-config` loads with this
/// too, so it says ok exactly when `serve` would start with the file.
fn load(path: &PathBuf) -> Result<Config, ExitCode> {
    Config::load_to_serve(path).map_err(|err: ConfigError| {
        eprintln!("slidegate: {err}");
        ExitCode::from(crate::exit::EX_USAGE)
    })
}

/// Runs `slidegate serve`.
pub fn run(args: ServeArgs) -> crate::exit::CommandResult {
    let mut config = match load(&args.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    if let Err(message) = init_logging(config.server.log_format) {
        eprintln!("slidegate: {message}");
        return Ok(ExitCode::from(crate::exit::EX_USAGE));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Memory freed by closed connections goes back to the system.
    crate::heap_trim::spawn();
    runtime.block_on(async {
        // Installed before the address is announced: a SIGTERM from then on
        // stops gracefully, a SIGHUP reloads.
        let signals = Signals::install();
        let server = Server::bind(&config).await?.reload_from(&args.config);
        // The limiter holds the plans' keys as digests only.
        config.limiter.plans.keys.forget_raw_keys();
        if config.server.watch_config {
            crate::watch::spawn(args.config.clone(), server.reloader())?;
            tracing::info!(path = %args.config.display(), "watching the configuration file: a change reloads it");
        }
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let shutdown = signals.until_shutdown(server.reloader(), server.access_log_reopen());
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
        if let Some(grpc) = server.grpc_addr() {
            eprintln!("slidegate: envoy rate limit service (gRPC) on {grpc}");
        }
        if let Some(auth) = server.auth_addr() {
            eprintln!("slidegate: forward auth on {auth}");
        }
        eprintln!("slidegate: listening on {}, forwarding to {upstream}, store {store}", server.local_addr());
        server.run(shutdown).await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs `slidegate check-config`.
pub fn check_config(args: CheckConfigArgs) -> crate::exit::CommandResult {
    // The group requires exactly one of the two.
    let Some(file) = args.config.or(args.file) else {
        return Ok(ExitCode::from(crate::exit::EX_USAGE));
    };
    let config = match load(&file) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    outln!("{}: ok", file.display());
    for warning in config.warnings() {
        eprintln!("slidegate: warning: {warning}");
    }
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
        if let Some(domain) = slidegate_server::envoy::override_domain(&rule.name) {
            outln!("  envoy domain {domain}: a descriptor's limit override from Envoy is applied");
            continue;
        }
        if rule.name.starts_with(slidegate_server::envoy::RULE_PREFIX) {
            // An Envoy descriptor's limit: no HTTP path or method to show.
            outln!("  envoy descriptor {}: {limits}", rule.name);
            continue;
        }
        outln!("  rule {} {methods} {}: {limits}", rule.name, rule.path);
    }
    if let Some(addr) = config.server.grpc_listen {
        outln!("  envoy rate limit service on {addr}, domains: {}", config.envoy.domains().join(", "));
    }
    let plans = &config.limiter.plans;
    for (i, plan) in plans.plans.iter().enumerate() {
        let keys = plans.keys.digests().iter().filter(|(_, p)| *p == i).count()
            + plans.keys.raw_keys().filter(|(_, p)| *p == i).count();
        let default = if plans.default_plan == Some(i) { ", the default" } else { "" };
        let limits: Vec<String> = plan
            .limits
            .iter()
            .flat_map(|(rule, limits)| {
                limits.iter().map(move |l| format!("{rule}: {} = {}", l.name, l.limit))
            })
            .collect();
        outln!("  plan {} ({keys} keys{default}): {}", plan.name, limits.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The signals `serve` acts on. Each one whose default action would end the
/// process is handled, so none ends it without a line in the log: SIGTERM,
/// SIGINT and SIGQUIT stop it gracefully, SIGHUP reloads the configuration,
/// SIGUSR1 and SIGUSR2 are logged and ignored. (SIGKILL cannot be caught;
/// SIGPIPE is ignored by the Rust runtime.)
struct Signals {
    #[cfg(unix)]
    handlers: Vec<(&'static str, Action, tokio::signal::unix::Signal)>,
}

/// What a signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(unix), allow(dead_code))]
enum Action {
    Stop,
    Reload,
    Ignore,
}

impl Signals {
    /// Installs the handlers now, not when the future is first polled, so
    /// that a signal arriving while the server is busy starting is not lost
    /// to the default action. Call it inside the runtime.
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let wanted = [
                ("SIGTERM", Action::Stop, SignalKind::terminate()),
                ("SIGINT", Action::Stop, SignalKind::interrupt()),
                ("SIGQUIT", Action::Stop, SignalKind::quit()),
                ("SIGHUP", Action::Reload, SignalKind::hangup()),
                ("SIGUSR1", Action::Ignore, SignalKind::user_defined1()),
                ("SIGUSR2", Action::Ignore, SignalKind::user_defined2()),
            ];
            let mut handlers = Vec::new();
            for (name, action, kind) in wanted {
                match signal(kind) {
                    Ok(handler) => handlers.push((name, action, handler)),
                    Err(err) => tracing::warn!(%err, "cannot handle {name}: it keeps its default action"),
                }
            }
            Signals { handlers }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Completes on the first signal that stops the server; meanwhile
    /// reloads the configuration on each SIGHUP, and reopens the access log
    /// (its file may have been rotated away).
    async fn until_shutdown(self, reloader: Reloader, access_log: Option<AccessLogReopen>) {
        #[cfg(unix)]
        {
            let mut handlers = self.handlers;
            loop {
                let received = next_signal(&mut handlers).await;
                let Some((name, action)) = received else {
                    // Every handler is gone: nothing left to wait for.
                    return std::future::pending().await;
                };
                match action {
                    Action::Stop => {
                        tracing::info!("shutdown signal received ({name}): finishing open connections");
                        return;
                    }
                    Action::Reload => {
                        tracing::info!("{name} received: reloading the configuration");
                        if let Some(log) = &access_log {
                            log.reopen();
                        }
                        let reloader = reloader.clone();
                        // Logged and counted by the reloader, whatever the outcome.
                        let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
                    }
                    Action::Ignore => tracing::info!(
                        "{name} received: ignored (SIGHUP reloads the configuration, SIGTERM stops)"
                    ),
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = (reloader, access_log);
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutdown signal received (Ctrl-C): finishing open connections");
        }
    }
}

/// The next signal any of `handlers` receives, by name and action; `None`
/// when none can receive any more.
#[cfg(unix)]
async fn next_signal(
    handlers: &mut [(&'static str, Action, tokio::signal::unix::Signal)],
) -> Option<(&'static str, Action)> {
    std::future::poll_fn(|cx| {
        let mut open = false;
        for (name, action, handler) in handlers.iter_mut() {
            match handler.poll_recv(cx) {
                std::task::Poll::Ready(Some(())) => return std::task::Poll::Ready(Some((*name, *action))),
                std::task::Poll::Ready(None) => {}
                std::task::Poll::Pending => open = true,
            }
        }
        if open {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(None)
        }
    })
    .await
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
