//! The Grafana dashboard (`deploy/grafana/slidegate.json`) and the
//! Prometheus rules (`deploy/prometheus/rules.yml`) name only metrics a
//! running `serve` exposes: a metric renamed in the code and not in them
//! fails here, not on a dashboard gone blank.
//!
//! Names are read from the queries (the dashboard's panel `expr`s and its
//! variables' queries, the rules' `expr`s) as PromQL reads them:
//! identifiers of letters, digits, `_` and `:`. Those starting with
//! `slidegate_` are series, compared with the sample names of a live
//! `/metrics` as written (`_total`, `_bucket` and all, which is how a query
//! names them); those of the form `level:slidegate_…:operation` are
//! recording rules, which `rules.yml` must define.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use common::*;

#[test]
fn the_dashboard_and_the_rules_name_only_metrics_serve_exposes() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Slidegate::start(&format!(
        r#"{head}
[access_log]
path = "{log}"

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "upload"
path = "/upload"
limits = [{{ limit = 1, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = keyed_head(upstream.addr, "admin_on_public = true", &redis_decides(&redis)),
        log = log.display(),
    ));
    let statuses: Vec<u16> = ["/api/search", "/api/search", "/api/search", "/upload"]
        .into_iter()
        .map(|target| sg.get(target, &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 200]);

    let reply = sg.get("/metrics", &[]);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(reply.body.ends_with("\n# EOF\n"), "{}", reply.body);
    let metrics = sg.metrics();
    assert_eq!(metrics["slidegate_requests_allowed_total{rule=\"search\"}"], 2.0);
    assert_eq!(metrics["slidegate_requests_denied_total{rule=\"search\"}"], 1.0);
    assert_eq!(metrics["slidegate_requests_allowed_total{rule=\"upload\"}"], 1.0);
    assert_eq!(metrics["slidegate_store_latency_seconds_count"], 4.0);
    let exposed = sample_names(&reply.body);

    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana/slidegate.json")).unwrap();
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    let dashboard = queries.join("\n");
    let rules_file = repo_file("deploy/prometheus/rules.yml");
    let rules = rule_expressions(&rules_file).join("\n");

    for (file, text, expected) in [
        ("deploy/grafana/slidegate.json", &dashboard, "slidegate_store_latency_seconds_bucket"),
        ("deploy/prometheus/rules.yml", &rules, "slidegate_config_reloads_total"),
    ] {
        let named = metric_names(text);
        // The names were found at all: a reader that found none would pass.
        assert!(named.contains(expected), "{file}: {expected} not among {named:?}");
        let missing: Vec<&String> = named.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} names metrics /metrics does not expose: {missing:?}\n{}",
            reply.body
        );
    }

    let recorded: BTreeSet<String> = rules_file
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- record:"))
        .map(|name| name.trim().to_owned())
        .collect();
    assert!(recorded.contains("rule:slidegate_requests_allowed:rate5m"), "{recorded:?}");
    for (file, text) in
        [("deploy/grafana/slidegate.json", &dashboard), ("deploy/prometheus/rules.yml", &rules)]
    {
        let missing: Vec<String> = recording_rule_names(text).difference(&recorded).cloned().collect();
        assert!(missing.is_empty(), "{file} uses recording rules rules.yml does not define: {missing:?}");
    }

    // And the comparison catches a name that is not exposed.
    let broken = metric_names("sum(rate(slidegate_requests_alowed_total[5m]))");
    assert_eq!(broken.difference(&exposed).collect::<Vec<_>>(), ["slidegate_requests_alowed_total"]);
}

/// The text of a file of the repository.
fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// The queries of a Grafana dashboard: its panels' `expr`s and its
/// variables' queries.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Array(items) => items.iter().for_each(|item| dashboard_queries(item, out)),
        serde_json::Value::Object(fields) => {
            for (key, field) in fields {
                match (key.as_str(), field) {
                    ("expr" | "query" | "definition", serde_json::Value::String(query)) => {
                        out.push(query.clone())
                    }
                    _ => dashboard_queries(field, out),
                }
            }
        }
        _ => {}
    }
}

/// The `expr`s of a rules file: each on its `expr:` line, or the block
/// indented under it (`expr: |`).
fn rule_expressions(rules: &str) -> Vec<String> {
    let mut expressions = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(expr) = line.trim_start().strip_prefix("expr:") else { continue };
        let mut expression = expr.trim().trim_start_matches(['|', '>', '-']).to_owned();
        let indent = line.len() - line.trim_start().len();
        while let Some(next) = lines.next_if(|next| next.len() - next.trim_start().len() > indent) {
            expression.push('\n');
            expression.push_str(next);
        }
        expressions.push(expression);
    }
    expressions
}

/// The PromQL identifiers in `text`: runs of letters, digits, `_` and `:`
/// not starting with a digit.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':'))
}

/// The series `text` names: identifiers starting with `slidegate_`.
fn metric_names(text: &str) -> BTreeSet<String> {
    identifiers(text).filter(|word| word.starts_with("slidegate_")).map(str::to_owned).collect()
}

/// The recording rules `text` names: `level:slidegate_…:operation`.
fn recording_rule_names(text: &str) -> BTreeSet<String> {
    identifiers(text)
        .filter(|word| {
            let parts: Vec<&str> = word.split(':').collect();
            parts.len() == 3
                && parts.iter().all(|part| !part.is_empty())
                && parts[1].starts_with("slidegate_")
        })
        .map(str::to_owned)
        .collect()
}

/// The name of every sample in an exposition, as a query names it.
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}
