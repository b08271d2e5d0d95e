//! `slidegate identity hash`: the keyed hash the offenders page, the access
//! log and the process log show for an API key or a client address, so an
//! operator can find a customer there, or tell who a listed hash is.
//!
//! The hash is made by the limiter the configuration describes, exactly as
//! `serve` makes it: the same secret, the same IPv6 grouping. Without a
//! configured secret each `serve` process draws its own, and no other
//! process can compute its hashes: refused rather than printed wrong.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use slidegate::{MemoryStore, Source};
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
pub fn run(args: IdentityArgs) -> crate::CommandResult {
    let IdentityCommand::Hash(args) = args.command;
    match hash(&args) {
        Ok(hash) => {
            outln!("{hash}");
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("slidegate: {message}");
            Ok(ExitCode::from(crate::EX_USAGE))
        }
    }
}

/// The 16 hex digits `serve` shows for the key or address in `args` (all 32
/// with the source, `--full`), or why
/// there is no true one to print.
fn hash(args: &HashArgs) -> Result<String, String> {
    let config = Config::load(&args.config).map_err(|err| err.to_string())?;
    let identity = &config.limiter.identity;
    let file = args.config.display();
    if identity.secret.is_none() {
        return Err(format!(
            "{file} sets no [identity] ip_hash_secret_env: each serve process then hashes with a random \
             secret of its own, which no other process can reproduce; set it to match the offenders page"
        ));
    }
    if args.key.is_some() && identity.api_key_header.is_none() {
        return Err(format!(
            "{file} sets no [identity] api_key_header: serve reads no API key, so it counts every \
             request by its client IP; use --ip"
        ));
    }
    // Only the identity part of the limiter is used; the store is never asked.
    let limiter =
        RateLimiter::from_config(&config.limiter, MemoryStore::new()).map_err(|err| err.to_string())?;
    let extractor = limiter.identity();
    // The digest does not depend on the rule: any scope gives the same hash.
    let scope: Arc<str> = Arc::from("");
    let identity = match (&args.key, &args.ip) {
        (Some(key), _) => extractor.identity(&scope, Source::ApiKey, check_key(key)?.as_bytes()),
        (None, Some(ip)) => {
            let ip: IpAddr = ip.parse().map_err(|_| {
                format!("--ip {ip:?} is not an IP address: expected one address, such as 203.0.113.7 or 2001:db8::1")
            })?;
            extractor.identity(&scope, Source::Ip, &extractor.ip_bytes(ip))
        }
        (None, None) => return Err("give --key KEY or --ip ADDRESS".to_owned()),
    };
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
