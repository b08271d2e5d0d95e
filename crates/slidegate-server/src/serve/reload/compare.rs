//! What a reloaded file changes from the configuration running: the rules,
//! limits, plans and lists it changes (applied), the settings the process
//! keeps until a restart (named, not applied), and a refused file's errors,
//! one a line. Pure functions of two [`Config`]s: nothing here touches the
//! running limiter, which `mod.rs` replaces only once these have answered.

use std::collections::HashMap;
use std::fmt::Debug;

use serde::Serialize;
use slidegate_http::config::{IdentityKind, LimitConfig, PlansConfig, RuleConfig, RuleLimits};

use crate::config::{Config, ConfigError};

/// What a reload changed.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Reloaded {
    /// Always `true`: the new configuration is the one running.
    pub reloaded: bool,
    /// Rules the file has and the running configuration had not.
    pub rules_added: Vec<String>,
    /// Rules the running configuration had and the file has not.
    pub rules_removed: Vec<String>,
    /// Rules of both whose settings differ.
    pub rules_changed: Vec<String>,
    /// Limits (`rule/policy`) of rules kept whose algorithm and quota the
    /// rule had under no name (changed, renamed with another quota, or
    /// added): their counters start from zero, since each limit's state is
    /// kept apart by algorithm and quota. All of them when the identity
    /// secret changed.
    pub limits_restarted: Vec<String>,
    /// Plans (`[[plans]]`) added, removed, or whose limits changed, by name.
    pub plans_changed: Vec<String>,
    /// Whether the keys file maps keys to other plans, or `default_plan`
    /// names another plan.
    pub plan_keys_changed: bool,
    /// Whether the global allow or deny list (`[lists]`) names other
    /// clients; a rule's own lists count as a change of its rule.
    pub lists_changed: bool,
    /// Settings the file changes that the running process keeps until a
    /// restart (`server.listen`, `store`, …).
    pub restart_required: Vec<String>,
}

/// Every problem of `err` by its location and message, one a line: the
/// first line of each (the rest is the source excerpt, for a terminal).
pub(super) fn located(err: &ConfigError) -> String {
    let first_line = |err: &ConfigError| err.to_string().lines().next().unwrap_or_default().to_owned();
    err.errors().iter().map(first_line).collect::<Vec<_>>().join("\n")
}

/// The rules and limits `new` changes from `old`.
pub(super) fn changes(old: &Config, new: &Config) -> Reloaded {
    let (old_rules, new_rules) = (&old.limiter.rules, &new.limiter.rules);
    // By name in a map: a scan of the other side per rule made a reload of
    // 30,000 rules take 7 s.
    fn by_name(rules: &[RuleConfig]) -> HashMap<&str, &RuleConfig> {
        rules.iter().map(|r| (r.name.as_str(), r)).collect()
    }
    let (old_by_name, new_by_name) = (by_name(old_rules), by_name(new_rules));
    let names = |rules: &[RuleConfig], other: &HashMap<&str, &RuleConfig>| -> Vec<String> {
        rules.iter().filter(|r| !other.contains_key(r.name.as_str())).map(|r| r.name.clone()).collect()
    };
    // The secret keys every identity: another one restarts every counter.
    let secret_changed =
        new.limiter.identity.secret.is_some() && new.limiter.identity.secret != old.limiter.identity.secret;
    let mut rules_changed = Vec::new();
    let mut limits_restarted = Vec::new();
    let mut listed = std::collections::HashSet::new();
    for rule in new_rules {
        let Some(&before) = old_by_name.get(rule.name.as_str()) else { continue };
        // Every part of a rule is plain data: its debug form is its whole value.
        if differs(before, rule) {
            rules_changed.push(rule.name.clone());
        }
        // A limit's counters are kept under its algorithm and quota and the
        // identity counted, not its name: one the rule counted the same way,
        // under any name, carries on; any other starts from zero, a renamed
        // policy's new quota included.
        let kept = counted(before);
        for (limit, keyed) in counted(rule) {
            let carried = kept.iter().any(|(k, was_keyed)| k.limit == limit.limit && *was_keyed == keyed);
            if secret_changed || !carried {
                let name = format!("{}/{}", rule.name, limit.name);
                if listed.insert(name.clone()) {
                    limits_restarted.push(name);
                }
            }
        }
    }
    let (old_plans, new_plans) = (&old.limiter.plans, &new.limiter.plans);
    let plan_names = |a: &PlansConfig, b: &PlansConfig| -> Vec<String> {
        a.plans.iter().filter(|p| b.position(&p.name).is_none()).map(|p| p.name.clone()).collect()
    };
    let mut plans_changed = plan_names(new_plans, old_plans);
    plans_changed.extend(plan_names(old_plans, new_plans));
    for plan in &new_plans.plans {
        let before = old_plans.position(&plan.name).map(|i| &old_plans.plans[i]);
        if before.is_some_and(|before| differs(&before.limits, &plan.limits)) {
            plans_changed.push(plan.name.clone());
        }
    }
    // Plans are named by their index: a default naming the same plan may
    // have another index after plans were added or removed.
    fn default_name(plans: &PlansConfig) -> Option<&str> {
        plans.default_plan.and_then(|i| plans.plans.get(i)).map(|plan| plan.name.as_str())
    }
    let plan_keys_changed =
        old_plans.keys != new_plans.keys || default_name(old_plans) != default_name(new_plans);
    Reloaded {
        reloaded: true,
        rules_added: names(new_rules, &old_by_name),
        rules_removed: names(old_rules, &new_by_name),
        rules_changed,
        limits_restarted,
        plans_changed,
        plan_keys_changed,
        lists_changed: old.limiter.lists != new.limiter.lists,
        restart_required: Vec::new(),
    }
}

/// Every limit of a rule with the identities it is counted under: API keys
/// (`true`) or addresses (`false`). Each has its own counters, so a limit
/// moved from one to the other (a split rule's set, a shared rule's
/// `identity`) starts from zero for the requests that move.
fn counted(rule: &RuleConfig) -> Vec<(&LimitConfig, bool)> {
    match &rule.limits {
        RuleLimits::Shared { limits, identity: IdentityKind::ApiKey } => {
            limits.iter().flat_map(|l| [(l, true), (l, false)]).collect()
        }
        RuleLimits::Shared { limits, .. } => limits.iter().map(|l| (l, false)).collect(),
        RuleLimits::Split { authenticated, anonymous } => {
            authenticated.iter().map(|l| (l, true)).chain(anonymous.iter().map(|l| (l, false))).collect()
        }
        _ => Vec::new(),
    }
}

/// The settings `new` changes that the process keeps until a restart.
pub(super) fn restart_required(old: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (&old.server, &new.server);
    let server = [
        ("server.listen", differs(&a.listen, &b.listen)),
        ("server.threads", differs(&a.threads, &b.threads)),
        ("server.upstream", differs(&a.upstream, &b.upstream)),
        ("server.admin_listen", differs(&a.admin_listen, &b.admin_listen)),
        ("server.grpc_listen", differs(&a.grpc_listen, &b.grpc_listen)),
        ("server.auth_listen", differs(&a.auth_listen, &b.auth_listen)),
        ("server.admin_on_public", differs(&a.admin_on_public, &b.admin_on_public)),
        ("server.admin_prefix", differs(&a.admin_prefix, &b.admin_prefix)),
        ("server.check_token_env", a.check_token != b.check_token),
        ("server.shutdown_grace", differs(&a.shutdown_grace, &b.shutdown_grace)),
        ("server.watch_config", a.watch_config != b.watch_config),
        // A new certificate is presented at once; TLS on or off, a restart.
        ("server.tls", a.tls.is_some() != b.tls.is_some()),
        ("server.upstream_ca", differs(&a.upstream_ca, &b.upstream_ca)),
        ("server.upstream_http2", a.upstream_http2 != b.upstream_http2),
        ("server.http2", a.http2 != b.http2),
        ("server.body_timeout", differs(&a.body_timeout, &b.body_timeout)),
        ("server.min_body_rate", differs(&a.min_body_rate, &b.min_body_rate)),
        ("server.body_rate_grace", differs(&a.body_rate_grace, &b.body_rate_grace)),
        (
            "server.max_upstream_connections",
            differs(&a.max_upstream_connections, &b.max_upstream_connections),
        ),
        (
            "server.max_upstream_connections_per_client",
            differs(&a.max_upstream_connections_per_client, &b.max_upstream_connections_per_client),
        ),
        // Each listener's cap and timeouts are its acceptor's, set at bind.
        ("server.connections", differs(&a.connections, &b.connections)),
    ];
    let (a, b) = (&old.store, &new.store);
    // `[store] on_error` is each rule's default, applied with the rules.
    let store = differs(&a.redis, &b.redis)
        || differs(&a.prefix, &b.prefix)
        || differs(&a.username, &b.username)
        || a.password != b.password
        || differs(&a.tls_ca, &b.tls_ca)
        || differs(&a.engine, &b.engine)
        || differs(&a.layout, &b.layout)
        || a.snapshot != b.snapshot
        || old.limiter.guard != new.limiter.guard;
    let mut keys: Vec<String> =
        server.iter().filter(|(_, changed)| *changed).map(|(key, _)| (*key).to_owned()).collect();
    if store {
        keys.push("store".to_owned());
    }
    keys
}

/// Whether two values differ, for types that are plain data without
/// `PartialEq`: their debug forms are compared.
fn differs<T: Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") != format!("{b:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, "reload.toml").unwrap()
    }

    const RULES: &str = r#"
[[rules]]
name = "search"
path = "/search"
limits = [{ limit = 10, window = "1s", name = "burst" }, { limit = 500, window = "1h", name = "hour" }]

[[rules]]
name = "feed"
path = "/feed"
anonymous = [{ limit = 5, window = "1m" }]
authenticated = [{ limit = 50, window = "1m", name = "feed-key" }]
"#;

    #[test]
    fn only_limits_whose_algorithm_or_quota_changed_restart() {
        let old = config(RULES);
        let new = config(
            &RULES
                .replace("limit = 500, window = \"1h\"", "limit = 600, window = \"1h\"")
                .replace("limit = 10,", "limit = 10, cost = 2,")
                .replace("name = \"feed\"", "name = \"news\""),
        );
        let changed = changes(&old, &new);
        assert_eq!(changed.rules_added, ["news"]);
        assert_eq!(changed.rules_removed, ["feed"]);
        assert_eq!(changed.rules_changed, ["search"]);
        // A cost is not a limit: a renamed rule is a new one, not a restart.
        assert_eq!(changed.limits_restarted, ["search/hour"]);
        assert!(changes(&old, &old).rules_changed.is_empty());
    }

    /// A policy renamed along with its quota restarts under its new name;
    /// one renamed alone keeps its counters (they are kept by quota); one
    /// added to a rule starts from zero.
    #[test]
    fn a_renamed_policy_with_another_quota_restarts() {
        let old = config(RULES);
        let renamed = config(&RULES.replace(
            r#"{ limit = 500, window = "1h", name = "hour" }"#,
            r#"{ limit = 600, window = "1h", name = "hourly" }"#,
        ));
        assert_eq!(changes(&old, &renamed).limits_restarted, ["search/hourly"]);
        let name_only = config(&RULES.replace(r#"name = "hour""#, r#"name = "per-hour""#));
        let changed = changes(&old, &name_only);
        assert_eq!((changed.rules_changed, changed.limits_restarted), (vec!["search".to_owned()], vec![]));
        let added = config(&RULES.replace(
            r#"name = "hour" }]"#,
            r#"name = "hour" }, { limit = 5000, window = "1d", name = "day" }]"#,
        ));
        assert_eq!(changes(&old, &added).limits_restarted, ["search/day"]);
        // The same quota counted per key rather than per address: new counters.
        let moved = config(&RULES.replace(
            r#"anonymous = [{ limit = 5, window = "1m" }]
authenticated = [{ limit = 50, window = "1m", name = "feed-key" }]"#,
            r#"anonymous = [{ limit = 50, window = "1m", name = "feed-ip" }]
authenticated = [{ limit = 5, window = "1m", name = "feed-key" }]"#,
        ));
        assert_eq!(changes(&old, &moved).limits_restarted, ["feed/feed-key", "feed/feed-ip"]);
        let per_address =
            config(&RULES.replace("name = \"search\"\n", "name = \"search\"\nidentity = \"ip\"\n"));
        assert!(changes(&old, &per_address).limits_restarted.is_empty(), "addresses keep their counters");
        assert_eq!(
            changes(&per_address, &old).limits_restarted,
            ["search/burst", "search/hour"],
            "keys get new ones"
        );
    }

    /// Comparing two configurations is linear in their rules: eight times
    /// the rules take about eight times as long (each rule's name was looked
    /// for by a scan of the other side: a reload of 30,000 rules took 7 s).
    #[test]
    fn comparing_configurations_is_linear_in_the_number_of_rules() {
        let rules = |n: usize, limit: u64| {
            let mut text = String::new();
            for i in 0..n {
                text.push_str(&format!(
                    "[[rules]]\nname = \"rule-{i}\"\npath = \"/r{i}\"\nlimits = [{{ limit = {limit}, window = \"1m\" }}]\n"
                ));
            }
            (config(&text), config(&text.replace("rule-0\"", "rule-new\"")))
        };
        let fastest = |(old, new): &(Config, Config)| {
            crate::test_timing::fastest(|| {
                let changed = changes(old, new);
                assert_eq!(
                    (changed.rules_added, changed.rules_removed),
                    (vec!["rule-new".to_owned()], vec!["rule-0".to_owned()])
                );
            })
        };
        let (small, large) = (rules(3_000, 5), rules(24_000, 5));
        let (t_small, t_large) = (fastest(&small), fastest(&large));
        assert!(t_large < t_small * 14, "3,000 rules in {t_small:?}, 24,000 in {t_large:?}");
    }

    /// Carrying the metrics over is linear in the rules too (a scan per
    /// rule of the old ones made it quadratic: 42× for 8× the rules).
    #[test]
    fn carrying_metrics_over_is_linear_in_the_number_of_rules() {
        use slidegate_http::Metrics;
        let fastest = |n: usize| {
            let names = || (0..n).map(|i| format!("rule-{i}"));
            let old = Metrics::new(names());
            crate::test_timing::fastest(|| old.carried_over(names()))
        };
        let (t_small, t_large) = (fastest(3_000), fastest(24_000));
        assert!(t_large < t_small * 14, "3,000 rules in {t_small:?}, 24,000 in {t_large:?}");
    }

    #[test]
    fn another_identity_secret_restarts_every_limit() {
        let old = config(RULES);
        let keyed = |secret: &str| {
            let text = format!("[identity]\nip_hash_secret_env = \"S\"\n{RULES}");
            Config::parse_with_env(&text, "reload.toml", &|_| Some(secret.to_owned())).unwrap()
        };
        let restarted = changes(&old, &keyed("a-secret-long-enough-for-anyone-1")).limits_restarted;
        assert_eq!(restarted, ["search/burst", "search/hour", "feed/feed-key", "feed/feed"]);
        assert!(changes(
            &keyed("a-secret-long-enough-for-anyone-1"),
            &keyed("a-secret-long-enough-for-anyone-1")
        )
        .limits_restarted
        .is_empty());
        // No secret in the file: the running one is kept.
        assert!(changes(&keyed("a-secret-long-enough-for-anyone-1"), &old).limits_restarted.is_empty());
    }

    #[test]
    fn plans_and_lists_that_change_are_named() {
        const PLANS: &str = r#"
[[plans]]
name = "free"
limits = { search = [{ limit = 5, window = "1s" }] }

[[plans]]
name = "pro"
limits = { search = [{ limit = 40, window = "1s" }] }
"#;
        let old =
            config(&format!("[identity]\napi_key_header = \"k\"\ndefault_plan = \"free\"\n{PLANS}{RULES}"));
        let same = changes(&old, &old);
        assert!(same.plans_changed.is_empty() && !same.plan_keys_changed && !same.lists_changed);
        let text = format!("[identity]\napi_key_header = \"k\"\ndefault_plan = \"pro\"\n{PLANS}{RULES}")
            .replace("limit = 40, window", "limit = 60, window")
            .replace("name = \"free\"", "name = \"team\"");
        let new = config(&text.replacen(
            "[[rules]]",
            "[lists]\ndeny = { cidrs = [\"10.0.0.0/8\"] }\n\n[[rules]]",
            1,
        ));
        let changed = changes(&old, &new);
        assert_eq!(changed.plans_changed, ["team", "free", "pro"]);
        assert!(changed.plan_keys_changed, "default_plan names pro now");
        assert!(changed.lists_changed);
        assert_eq!(
            (changed.rules_changed, changed.limits_restarted),
            (vec![], vec![]),
            "plans are not rules"
        );
    }

    /// The forward-auth listener is kept until a restart, both ways: a file
    /// that adds `auth_listen` cannot start it, and one that drops it
    /// cannot stop it, so a rule charged after the response (which the
    /// hook would pass every time) is refused while it runs.
    #[test]
    fn the_forward_auth_listener_is_kept_until_a_restart() {
        const SERVER: &str = "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n";
        let hooked = format!("{SERVER}auth_listen = \"127.0.0.1:9091\"\n");
        let (with, without) = (config(&hooked), config(SERVER));
        assert_eq!(restart_required(&without, &with), ["server.auth_listen"]);
        assert_eq!(restart_required(&with, &without), ["server.auth_listen"]);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reload.toml");
        let rule = "[[rules]]\nname = \"probes\"\npath = \"/p\"\nlimits = [{ limit = 3, window = \"1m\" }]\n";
        std::fs::write(&path, format!("{SERVER}{rule}count_status = [404]\n")).unwrap();
        assert!(Config::load_to_reload(&path, &without.server).is_ok());
        let err = Config::load_to_reload(&path, &with.server).unwrap_err();
        assert_eq!(
            located(&err),
            format!(
                "{}:8:16: count_status charges a request after its response, which a forward-auth hook \
                 asks before and never hears, and the forward-auth listener this process started with \
                 ([server] auth_listen) keeps running until a restart: drop count_status from rule \
                 \"probes\", or restart without auth_listen",
                path.display()
            )
        );
    }

    #[test]
    fn the_keys_a_process_was_built_around_need_a_restart() {
        let old = config("[server]\nlisten = \"127.0.0.1:8080\"\n");
        let new = config(
            "[server]\nlisten = \"127.0.0.1:8081\"\nthreads = 2\n[store]\ntimeout_ms = 20\non_error = \"deny\"\n",
        );
        assert_eq!(restart_required(&old, &new), ["server.listen", "server.threads", "store"]);
        let capped = config("[server]\nlisten = \"127.0.0.1:8080\"\nconnections.public = { max = 100 }\n");
        assert_eq!(restart_required(&old, &capped), ["server.connections"]);
        // `on_error` alone is each rule's default: applied with the rules.
        let deny = config("[server]\nlisten = \"127.0.0.1:8080\"\n[store]\non_error = \"deny\"\n");
        assert!(restart_required(&old, &deny).is_empty());
        // The layout, and the bucket count the packed one derives, are the
        // store's: a reload cannot move the state to other keys.
        let env = |name: &str| (name == "SECRET").then(|| "s".to_owned());
        let with_store = |store: &str| {
            let text = format!(
                "[server]\nlisten = \"127.0.0.1:8080\"\n[store]\nurl = \"redis://127.0.0.1:7000\"\n{store}\
                 [identity]\nip_hash_secret_env = \"SECRET\"\n"
            );
            Config::parse_with_env(&text, "reload.toml", &env).unwrap()
        };
        let per_key = with_store("");
        let packed = with_store("layout = \"packed\"\n");
        let bigger = with_store("layout = \"packed\"\nexpected_identities = 5000000\n");
        assert_eq!(restart_required(&per_key, &packed), ["store"]);
        assert_eq!(restart_required(&packed, &bigger), ["store"]);
        assert!(restart_required(&packed, &packed).is_empty());
    }
}
