//! From the TOML mirror to a [`Config`]: every rule the types cannot express
//! (ranges, contradictions, duplicates, environment variables) is checked
//! here, and every error is located at the offending value. One file per
//! part of the file: `server` (`[server]`), `store` (`[store]`: the Redis
//! target, its login and the limiter's guard), `identity`, `rules` and `plans`
//! (`[[plans]]` and the keys file).
//!
//! Every error of a file is reported, not only the first: `document` reads
//! the text part by part, and [`Validator::config`] validates each
//! independent part — `[server]`, `[store]`, `[identity]`, `[access_log]`,
//! each `[[rules]]` entry and the plans — on its own, gathering one error per part in
//! [`Found`]. A new part is one more `found.part(self.new_part(..))` there.

mod access_log;
mod connections;
mod document;
mod envoy;
mod identity;
mod lists;
mod plans;
mod protocols;
mod rules;
mod server;
mod snapshot;
mod store;

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use slidegate_http::config::{HeadersConfig, LimiterConfig, OnError, RuleConfig};
use toml::Spanned;

use super::error::ConfigError;
use super::raw::{RawConfig, RawServer};
use super::types::Config;
use super::types::ServerConfig;

impl Config {
    /// Reads and validates the configuration in `path`, reading the variables
    /// it names from the process environment.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Invalid`]
    /// with line and column for anything wrong inside it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::load_for(path.as_ref(), Use::Library, Listening::default())
    }

    /// [`Config::load`] for `slidegate serve`, which also needs what only
    /// the proxy uses (`[server] upstream`). `serve` and `check-config` both
    /// load with this, so `check-config` says ok exactly when `serve` would
    /// start with the file.
    ///
    /// # Errors
    /// As [`Config::load`], and a located error when `upstream` is missing.
    pub fn load_to_serve(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::load_for(path.as_ref(), Use::Serve, Listening::default())
    }

    /// [`Config::load_to_serve`] for a reload of a `serve` started with
    /// `running`, whose listeners stay until a restart whatever the file
    /// says: what they cannot serve is refused as if the file set them
    /// (a rule charged after the response, while the forward-auth listener
    /// runs, even when the file drops `auth_listen`).
    pub(crate) fn load_to_reload(path: &Path, running: &ServerConfig) -> Result<Self, ConfigError> {
        Self::load_for(path, Use::Serve, Listening { auth: running.auth_listen.is_some() })
    }

    /// The limiter the configuration in `path` describes, for a tool that
    /// builds it and serves nothing (`slidegate replay`): of `[server]`, only
    /// `max_delayed` (the limiter's) is validated. What only `serve` uses —
    /// the variable `check_token_env` names, TLS files, listeners — is not
    /// asked for, so a file `serve` runs with on another machine loads here.
    ///
    /// # Errors
    /// As [`Config::load`], for every part but `[server]`'s other keys.
    pub fn load_limiter(path: impl AsRef<Path>) -> Result<LimiterConfig, ConfigError> {
        Self::load_for(path.as_ref(), Use::Limiter, Listening::default()).map(|config| config.limiter)
    }

    fn load_for(path: &Path, used: Use, listening: Listening) -> Result<Self, ConfigError> {
        let bytes =
            std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let env = |name: &str| std::env::var(name).ok();
        Self::parse_listening(decode(path, &bytes)?, path, &env, used, listening)
    }

    /// Validates the configuration text `source`; `path` names it in errors.
    /// Environment variables named by the config (the hash secret) are read
    /// from the process environment now; [`Config::parse_with_env`] takes them
    /// from elsewhere.
    ///
    /// ```
    /// use slidegate_server::Config;
    ///
    /// let err = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\nlisten_on = 1\n", "demo.toml")
    ///     .unwrap_err();
    /// assert_eq!(err.location(), Some((3, 1)));
    /// assert!(err.to_string().starts_with("demo.toml:3:1: unknown field `listen_on`"));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the line and column of the problem, or
    /// [`ConfigError::Several`] holding one for each part of the file that
    /// has one.
    pub fn parse(source: &str, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::parse_with_env(source, path, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with the environment given: `env(name)` is the value
    /// of the variable `name`, or `None` when it is unset.
    ///
    /// ```
    /// use slidegate_server::Config;
    ///
    /// let source = "[identity]\nip_hash_secret_env = \"HASH_SECRET\"\n";
    /// let env = |name: &str| (name == "HASH_SECRET").then(|| "s3cret".to_owned());
    /// let config = Config::parse_with_env(source, "demo.toml", &env)?;
    /// assert_eq!(config.limiter.identity.secret.as_deref(), Some(&b"s3cret"[..]));
    /// # Ok::<(), slidegate_server::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Config::parse`].
    pub fn parse_with_env(
        source: &str,
        path: impl AsRef<Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::parse_for(source, path.as_ref(), env, Use::Library)
    }

    pub(super) fn parse_for(
        source: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        used: Use,
    ) -> Result<Self, ConfigError> {
        Self::parse_listening(source, path, env, used, Listening::default())
    }

    fn parse_listening(
        source: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        used: Use,
        listening: Listening,
    ) -> Result<Self, ConfigError> {
        let fail = |span: Option<Range<usize>>, message: String| ConfigError::at(path, source, span, message);
        let mut found = Found::default();
        let config = document::read(source, &fail, &mut found).and_then(|read| {
            Validator { fail: &fail, env, used, listening, unread: &read.unread, path }
                .config(read.raw, &mut found)
        });
        match (ConfigError::from_found(found.0), config) {
            (None, Some(config)) => Ok(config),
            (Some(err), _) => Err(err),
            // A part that failed always says why.
            (None, None) => Err(fail(None, "invalid configuration".to_owned())),
        }
    }
}

/// What a configuration is loaded for: the same file configures the tower
/// layer (its `[store]`, `[identity]`, `[headers]` and `[[rules]]`),
/// `slidegate serve`, which also needs an upstream, and `slidegate replay`,
/// which needs the limiter alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// [`Config::load`], [`Config::parse`]: any complete limiter.
    Library,
    /// [`Config::load_to_serve`]: the proxy too.
    Serve,
    /// [`Config::load_limiter`]: the limiter alone; `[server]` is read for
    /// its `max_delayed` only.
    Limiter,
}

/// The listeners of the process a file is reloaded into, which it keeps
/// until a restart whatever the file says; none for a file loaded to start.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Listening {
    /// A forward-auth listener (`[server] auth_listen`) runs.
    auth: bool,
}

/// The text of a configuration file; invalid UTF-8 is located at its first
/// bad byte like any other error (a plain read would say only "invalid data").
pub(super) fn decode<'b>(path: &Path, bytes: &'b [u8]) -> Result<&'b str, ConfigError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let valid = e.valid_up_to();
        // The prefix before the bad byte is valid UTF-8 by definition.
        let before = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        ConfigError::at(
            path,
            before,
            Some(valid..valid),
            format!("invalid UTF-8 (byte 0x{:02x}): expected a UTF-8 text file", bytes[valid]),
        )
    })
}

/// The errors found in a file: at most one per independent part.
#[derive(Default)]
pub(super) struct Found(Vec<ConfigError>);

impl Found {
    /// Keeps `err`.
    pub(super) fn push(&mut self, err: ConfigError) {
        self.0.push(err);
    }

    /// The value of one part of the file, or `None` with its error kept.
    fn part<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }
}

struct Validator<'a> {
    fail: &'a dyn Fn(Option<Range<usize>>, String) -> ConfigError,
    env: &'a dyn Fn(&str) -> Option<String>,
    used: Use,
    /// The listeners a reload cannot stop.
    listening: Listening,
    /// Top-level keys with a part that could not be read (its error found):
    /// a check across parts does not report such a part missing.
    unread: &'a BTreeSet<String>,
    /// The file validated: files it names are found next to it.
    path: &'a Path,
}

impl Validator<'_> {
    fn err(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        (self.fail)(Some(span), message.into())
    }

    /// Parses each string of an array, reporting an error at the element.
    fn each<T>(&self, values: Vec<Spanned<String>>) -> Result<Vec<T>, ConfigError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        values
            .into_iter()
            .map(|v| v.get_ref().parse().map_err(|e: T::Err| self.err(v.span(), e.to_string())))
            .collect()
    }

    /// The value of the environment variable `var` names, which must be set
    /// and not empty; `holds` says what the key's variable holds, for the error.
    fn env_value(&self, var: &Spanned<String>, holds: &str) -> Result<String, ConfigError> {
        match (self.env)(var.get_ref()) {
            Some(value) if !value.is_empty() => Ok(value),
            _ => {
                Err(self
                    .err(var.span(), format!("environment variable {} is not set: {holds}", var.get_ref())))
            }
        }
    }

    /// Validates each part of `raw`, adding one error per failing part to
    /// `found`; the configuration when every part is valid.
    fn config(&self, mut raw: RawConfig, found: &mut Found) -> Option<Config> {
        let server = found.part(self.server_part(raw.server));
        // Any Redis store is shared by the instances pointed at it.
        let url_span = (raw.store.url.as_ref().map(Spanned::span))
            .or_else(|| raw.store.cluster.as_ref().map(Spanned::span))
            .or_else(|| raw.store.sentinel.as_ref().map(Spanned::span));
        // A Cluster's identities live in different slots: no joint decisions.
        let joint = raw.store.cluster.is_none();
        let snapshot_span = raw.store.snapshot.as_ref().map(Spanned::span);
        let store =
            found.part(self.store(&mut raw.store).and_then(|store| Ok((store, self.guard(raw.store)?))));
        let plan_keys = plans::RawPlanKeys {
            plans_file: raw.identity.plans_file.take(),
            default_plan: raw.identity.default_plan.take(),
        };
        let identity = found.part(self.identity(raw.identity));
        if let (Some(span), Some(None)) = (url_span, identity.as_ref().map(|i| &i.secret)) {
            if !self.unread.contains("identity") {
                // Each instance would draw its own random secret: one client gets
                // a different key on each, and N instances admit N times the limit.
                found.push(self.err(
                    span,
                    "a shared store needs [identity] ip_hash_secret_env: without it each instance draws \
                     its own random hash secret, a client is counted under a different key on each, and \
                     instances sharing this store together admit a multiple of every limit",
                ));
            }
        }
        if let (Some(span), Some(None)) = (snapshot_span, identity.as_ref().map(|i| &i.secret)) {
            if !self.unread.contains("identity") {
                // A client's key is its hash under the secret: a new random
                // secret after the restart would find none of the snapshot's counts.
                found.push(self.err(
                    span,
                    "a snapshot needs [identity] ip_hash_secret_env: without it each start draws a new \
                     random hash secret, every client gets a new key, and the counts and blocks the \
                     snapshot kept would never be found",
                ));
            }
        }
        let on_error = store.as_ref().map_or(OnError::default(), |(store, _)| store.on_error);
        // Keys files are hashed with the identity's secret: without a valid
        // [identity], no list is read (its error is reported).
        let keys = identity.as_ref().map(|identity| self.list_keys(identity));
        let lists =
            keys.as_ref().and_then(|keys| found.part(self.lists(raw.lists.allow, raw.lists.deny, keys)));
        let mut rules: Vec<RuleConfig> = Vec::with_capacity(raw.rules.len());
        let mut names = std::collections::HashSet::with_capacity(raw.rules.len());
        // Plans naming a rule that failed are not reported for it.
        let mut rules_partial = self.unread.contains("rules");
        // A forward-auth hook asks before the upstream answers and never
        // hears the answer: a rule charged after the response cannot be
        // decided through it, whether the file sets the listener or a
        // reload leaves the running one (a pass for every hook request).
        let auth_listen = server.as_ref().is_some_and(|(server, _)| server.auth_listen.is_some());
        let hooked = auth_listen || self.listening.auth;
        for mut rule in raw.rules {
            let name_span = rule.get_ref().name.span();
            let after_response = rule.get_ref().cost_header.as_ref().map(|c| (c.span(), "cost_header"));
            let after_response = after_response
                .or_else(|| rule.get_ref().count_status.as_ref().map(|c| (c.span(), "count_status")));
            if let (true, Some((span, key))) = (hooked, after_response) {
                let name = rule.get_ref().name.get_ref();
                found.push(self.err(
                    span,
                    if auth_listen {
                        format!(
                            "{key} charges a request after its response, which a forward-auth hook \
                             ([server] auth_listen) asks before and never hears: drop {key} from rule \
                             {name:?}, or auth_listen"
                        )
                    } else {
                        format!(
                            "{key} charges a request after its response, which a forward-auth hook asks \
                             before and never hears, and the forward-auth listener this process started \
                             with ([server] auth_listen) keeps running until a restart: drop {key} from \
                             rule {name:?}, or restart without auth_listen"
                        )
                    },
                ));
                rules_partial = true;
                continue;
            }
            let (allow, deny) = (rule.get_mut().allow.take(), rule.get_mut().deny.take());
            let Some(mut rule) = found.part(self.rule(rule, on_error)) else {
                rules_partial = true;
                continue;
            };
            if let Some(keys) = &keys {
                let Some(lists) = found.part(self.lists(allow, deny, keys)) else { continue };
                rule.lists = lists;
            }
            // A set, not a scan of the rules so far: validation stays linear
            // in the number of rules (a reload of 30,000 took seconds).
            if !names.insert(rule.name.clone()) {
                found.push(self.err(
                    name_span,
                    format!("duplicate rule name {:?}: rule names must be unique", rule.name),
                ));
                continue;
            }
            rules.push(rule);
        }
        let mut headers = HeadersConfig::default();
        if let Some(legacy) = raw.headers.legacy {
            headers.legacy = legacy;
        }
        let access_log = found.part(raw.access_log.map(|table| self.access_log(table)).transpose());
        let partial = plans::Partial {
            rules: rules_partial,
            plans: self.unread.contains("plans"),
            identity: self.unread.contains("identity"),
        };
        let plans = identity
            .as_ref()
            .and_then(|identity| found.part(self.plans(raw.plans, plan_keys, &rules, identity, partial)));
        let envoy = found.part(self.envoy(raw.envoy, on_error, joint, &mut rules));
        let ((server, max_delayed), (store, guard), identity, access_log, lists, plans, envoy) =
            (server?, store?, identity?, access_log?, lists?, plans?, envoy?);
        let mut limiter = LimiterConfig::default();
        limiter.guard = guard;
        limiter.identity = identity;
        limiter.rules = rules;
        limiter.plans = plans;
        limiter.headers = headers;
        limiter.max_delayed = max_delayed;
        limiter.lists = lists;
        Some(Config { server, store, limiter, access_log, envoy })
    }

    /// `[server]`, which `serve` needs for its upstream, and the limiter's
    /// cap on held requests it sets.
    fn server_part(&self, raw: Option<Spanned<RawServer>>) -> Result<(ServerConfig, u32), ConfigError> {
        let (server_span, mut raw_server) =
            raw.map_or((None, Default::default()), |s| (Some(s.span()), s.into_inner()));
        let max_delayed = self.max_delayed(raw_server.max_delayed.take())?;
        if self.used == Use::Limiter {
            // Its keys were read (a typo or a wrong type is still an error),
            // but files and variables only the proxy uses are not looked for.
            return Ok((ServerConfig::default(), max_delayed));
        }
        let server = self.server(raw_server)?;
        if self.used == Use::Serve && server.upstream.is_none() && !self.unread.contains("server") {
            let table = if server_span.is_some() { "[server] has no upstream" } else { "no [server] table" };
            return Err((self.fail)(
                server_span,
                format!(
                    "{table}: serve forwards every request to it; expected upstream = \"http://host:port\" under [server]"
                ),
            ));
        }
        Ok((server, max_delayed))
    }
}
