//! `slidegate identity hash`: the keyed hash the offenders page, the access
//! log and the process log show for an API key or a client address, so an
//! operator can find a customer there, or tell who a listed hash is.
//! `slidegate identity show`: where that identity's state lives in Redis
//! under a rule's limits (its key, or in the packed layout its bucket's
//! window hashes and its field) and what each limit has left, read without
//! charging anything.
//!
//! The hash is made by the limiter the configuration describes, exactly as
//! `serve` makes it: the same secret, the same IPv6 grouping. Without a
//! configured secret each `serve` process draws its own, and no other
//! process can compute its hashes: refused rather than printed wrong.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use slidegate::{Charge, Identity, Location, MemoryStore, RedisStore, Request, Source, Store};
use slidegate_http::config::RuleLimits;
use slidegate_http::offenders::IdentityHash;
use slidegate_http::RateLimiter;
use slidegate_server::Config;

/// Arguments of `slidegate identity`.
#[derive(clap::Args)]
pub struct IdentityArgs {
    #[command(subcommand)]
    command: IdentityCommand,
}

#[derive(clap::Subcommand)]
enum IdentityCommand {
    /// Print the hash the offenders page and the logs show for an API key or a client IP.
    Hash(HashArgs),
    /// Print where an API key's or a client IP's state is in Redis under a
    /// rule, and what each of its limits has left (charges nothing).
    Show(ShowArgs),
}

/// Arguments of `slidegate identity show`.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("value").required(true).args(["key", "ip"]))]
struct ShowArgs {
    /// The configuration file (TOML) of the `serve` whose Redis to read.
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// The rule (`[[rule]] name`) whose limits to show.
    #[arg(long, value_name = "NAME")]
    rule: String,
    /// An API key, as clients send it in `[identity] api_key_header`.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// A client address (IPv4 or IPv6; IPv6 is grouped by `ipv6_prefix`).
    #[arg(long, value_name = "ADDRESS")]
    ip: Option<String>,
}

/// Arguments of `slidegate identity hash`.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("value").required(true).args(["key", "ip"]))]
struct HashArgs {
    /// The configuration file (TOML) of the `serve` whose hashes to match.
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// An API key, as clients send it in `[identity] api_key_header`.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// A client address (IPv4 or IPv6; IPv6 is grouped by `ipv6_prefix`).
    #[arg(long, value_name = "ADDRESS")]
    ip: Option<String>,
    /// Print the full form, `k:<32 hex>` or `ip:<32 hex>`, that
    /// `DELETE /v1/penalty/{id}` and a plans file (`k:<32 hex> PLAN`) take
    /// (the offenders page's id column).
    #[arg(long)]
    full: bool,
}

/// Runs `slidegate identity`.
pub fn run(args: IdentityArgs) -> crate::exit::CommandResult {
    let args = match args.command {
        IdentityCommand::Hash(args) => args,
        IdentityCommand::Show(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            return match runtime.block_on(show(&args)) {
                Ok(text) => {
                    out!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(message) => {
                    eprintln!("slidegate: {message}");
                    Ok(ExitCode::from(crate::exit::EX_USAGE))
                }
            };
        }
    };
    match hash(&args) {
        Ok(hash) => {
            outln!("{hash}");
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("slidegate: {message}");
            Ok(ExitCode::from(crate::exit::EX_USAGE))
        }
    }
}

/// What `identity show` prints: per limit of the rule, where the state is
/// and a peek (a cost-0 decision, which writes nothing).
async fn show(args: &ShowArgs) -> Result<String, String> {
    let config = Config::load(&args.config).map_err(|err| err.to_string())?;
    let file = args.config.display();
    let Some((target, options)) = slidegate_server::redis_options(&config) else {
        return Err(format!(
            "{file} names no Redis in [store]: the embedded store lives inside the serve process, \
             which no other process can read"
        ));
    };
    let Some(rule) = config.limiter.rules.iter().find(|r| r.name == args.rule) else {
        let names: Vec<&str> = config.limiter.rules.iter().map(|r| r.name.as_str()).collect();
        return Err(format!("{file} has no rule {:?}: its rules are {names:?}", args.rule));
    };
    let source = if args.key.is_some() { Source::ApiKey } else { Source::Ip };
    let identity =
        identity_of(&config, &file.to_string(), args.key.as_deref(), args.ip.as_deref(), &rule.name)?;
    let limits = match (&rule.limits, source) {
        (RuleLimits::Shared { limits, .. }, _) => limits,
        (RuleLimits::Split { authenticated, .. }, Source::ApiKey) => authenticated,
        (RuleLimits::Split { anonymous, .. }, _) => anonymous,
        _ => return Err(format!("rule {:?} has limits identity show does not know", rule.name)),
    };
    let store = RedisStore::connect_to(&target, options)
        .await
        .map_err(|e| format!("cannot reach Redis ({}): {e}", config.store.describe()))?;
    let store = match &config.store.prefix {
        Some(prefix) => store.with_prefix(prefix.clone()),
        None => store,
    };
    let mut text = format!(
        "identity {} under rule {:?} ({}, layout {})\n",
        IdentityHash::from(&identity).id(),
        rule.name,
        target_name(&config),
        store.layout()
    );
    for limit in limits {
        let peek = store
            .decide(Request::new(&identity, &[Charge::new(limit.limit, 0)]))
            .await
            .map_err(|e| format!("cannot read {}: {e}", limit.name))?;
        let decision = peek.decisions.first().copied().ok_or("no decision in the reply")?;
        text.push_str(&format!("  {}: {}\n", limit.name, limit.limit));
        match store.location(&identity, &limit.limit) {
            Location::Packed { stem, field } => {
                let hex: String = field.iter().map(|b| format!("{b:02x}")).collect();
                text.push_str(&format!(
                    "    packed: field {hex} of the window hashes {stem}<window number>\n"
                ));
            }
            Location::Key(key) => text.push_str(&format!("    key: {key}\n")),
            other => text.push_str(&format!("    {other:?}\n")),
        }
        text.push_str(&format!(
            "    remaining {} of {}, state kept for {} ms\n",
            decision.remaining,
            decision.limit,
            decision.reset_after.as_millis()
        ));
    }
    Ok(text)
}

/// The Redis `config` names, without the layout `identity show` prints itself.
fn target_name(config: &Config) -> String {
    let mut store = config.store.clone();
    store.layout = slidegate::Layout::PerKey;
    store.describe()
}

/// The identity `serve` makes for the API key or the address in `scope`
/// (a rule's name), or why there is no true one.
fn identity_of(
    config: &Config,
    file: &str,
    key: Option<&str>,
    ip: Option<&str>,
    scope: &str,
) -> Result<Identity, String> {
    let identity = &config.limiter.identity;
    if identity.secret.is_none() {
        return Err(format!(
            "{file} sets no [identity] ip_hash_secret_env: each serve process then hashes with a random \
             secret of its own, which no other process can reproduce; set it to match the offenders page"
        ));
    }
    if key.is_some() && identity.api_key_header.is_none() {
        return Err(format!(
            "{file} sets no [identity] api_key_header: serve reads no API key, so it counts every \
             request by its client IP; use --ip"
        ));
    }
    // Only the identity part of the limiter is used; the store is never asked.
    let limiter =
        RateLimiter::from_config(&config.limiter, MemoryStore::new()).map_err(|err| err.to_string())?;
    let extractor = limiter.identity();
    let scope: Arc<str> = Arc::from(scope);
    match (key, ip) {
        (Some(key), _) => Ok(extractor.identity(&scope, Source::ApiKey, check_key(key)?.as_bytes())),
        (None, Some(ip)) => {
            let ip: IpAddr = ip.parse().map_err(|_| {
                format!("--ip {ip:?} is not an IP address: expected one address, such as 203.0.113.7 or 2001:db8::1")
            })?;
            Ok(extractor.identity(&scope, Source::Ip, &extractor.ip_bytes(ip)))
        }
        (None, None) => Err("give --key KEY or --ip ADDRESS".to_owned()),
    }
}

/// The 16 hex digits `serve` shows for the key or address in `args` (all 32
/// with the source, `--full`), or why
/// there is no true one to print.
fn hash(args: &HashArgs) -> Result<String, String> {
    let config = Config::load(&args.config).map_err(|err| err.to_string())?;
    let file = args.config.display().to_string();
    // The digest does not depend on the rule: any scope gives the same hash.
    let identity = identity_of(&config, &file, args.key.as_deref(), args.ip.as_deref(), "")?;
    let hash = IdentityHash::from(&identity);
    Ok(if args.full { hash.id() } else { hash.short_hex() })
}

/// `key` if a request can carry it as its API key: one that cannot is never
/// counted under its own hash, and printing one would mislead.
fn check_key(key: &str) -> Result<&str, String> {
    if key.is_empty() {
        return Err("--key is empty: serve counts a request with an empty key by its client IP".to_owned());
    }
    if key.contains(',') {
        return Err("--key has a comma: serve refuses such a request with 400 (which of the keys counts \
                    is ambiguous) and never counts it"
            .to_owned());
    }
    if key.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err("--key has a control character: it cannot be an HTTP header value".to_owned());
    }
    if key.trim_matches([' ', '\t']) != key {
        return Err("--key starts or ends with a space: HTTP strips it from a header value, so no request \
                    carries this key"
            .to_owned());
    }
    Ok(key)
}
