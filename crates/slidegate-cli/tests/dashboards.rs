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
//!
//! The same live `/metrics` is also read as a strict OpenMetrics parser
//! reads it, whole: the families `serve` appends by hand beside
//! prometheus-client's must follow the format too, or a scraper that
//! enforces it refuses the entire scrape.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;

#[test]
fn the_dashboard_and_the_rules_name_only_metrics_serve_exposes() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let sg = Slidegate::start(&serve_config(&redis, &upstream, &dir.path().join("access.log")));
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

/// Every family of a live `/metrics` is valid OpenMetrics, the ones `serve`
/// writes by hand (reloads, upstream TLS failures, the access log, store
/// states, delays) as much as prometheus-client's: each declared once, with
/// a family name a counter's `_total` is not part of, followed only by its
/// own samples, help text escaped, and one `# EOF` at the end.
#[test]
fn the_whole_of_metrics_is_valid_openmetrics() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let sg = Slidegate::start(&serve_config(&redis, &upstream, &dir.path().join("access.log")));
    let statuses: Vec<u16> = ["/api/search", "/api/search", "/api/search"]
        .into_iter()
        .map(|target| sg.get(target, &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    // A reload that applies, then one that fails, so both samples count.
    assert_eq!(request(sg.addr, "POST", "/admin/reload", &[], b"").status, 200);
    std::fs::write(sg.config_path(), "[server\n").unwrap();
    assert_eq!(request(sg.addr, "POST", "/admin/reload", &[], b"").status, 422);

    let reply = sg.get("/metrics", &[]);
    assert_eq!(reply.status, 200, "{reply:?}");
    let families = openmetrics_families(&reply.body).unwrap_or_else(|err| panic!("{err}\n{}", reply.body));
    for (family, kind) in [
        ("slidegate_requests_allowed", "counter"),
        ("slidegate_delayed_seconds", "counter"),
        ("slidegate_breaker_open", "gauge"),
        ("slidegate_store_latency_seconds", "histogram"),
        ("slidegate_store_states", "gauge"),
        ("slidegate_delayed_requests", "gauge"),
        ("slidegate_delayed_requests_max", "gauge"),
        ("slidegate_config_reloads", "counter"),
        ("slidegate_upstream_tls_failures", "counter"),
        ("slidegate_access_log_dropped", "counter"),
    ] {
        assert_eq!(families.get(family).map(String::as_str), Some(kind), "{family}: {families:?}");
    }
    let metrics = sg.metrics();
    assert_eq!(metrics["slidegate_config_reloads_total{result=\"ok\"}"], 1.0);
    assert_eq!(metrics["slidegate_config_reloads_total{result=\"error\"}"], 1.0);
    assert_eq!(metrics["slidegate_upstream_tls_failures_total"], 0.0);
    assert_eq!(metrics["slidegate_access_log_dropped_total"], 0.0);
    assert_eq!(metrics["slidegate_store_states{store=\"fallback\"}"], 0.0);
    assert_eq!(metrics["slidegate_requests_denied_total{rule=\"search\"}"], 1.0);

    // And the parser refuses what it is here to refuse.
    for (exposition, error) in [
        ("# TYPE a gauge\na 1\n", "the text does not end with `# EOF\\n`"),
        ("# TYPE a gauge\na 1\n# EOF\n# EOF\n", "line 3: `# EOF` before the end"),
        ("# TYPE a gauge\n\na 1\n# EOF\n", "line 2: an empty line"),
        (
            "# TYPE a_total counter\na_total 1\n# EOF\n",
            "line 1: family a_total is named with its samples' `_total`",
        ),
        ("# TYPE a counter\na_total 1\n# TYPE a counter\n# EOF\n", "line 3: family a declared twice"),
        ("# HELP a x\n# TYPE a gauge\n# HELP a y\n# EOF\n", "line 3: a second HELP line for family a"),
        ("# TYPE a gauge\n# TYPE b gauge\na 1\n# EOF\n", "line 3: sample a in family b (gauge)"),
        ("# TYPE a counter\na 1\n# EOF\n", "line 2: sample a in family a (counter)"),
        ("# TYPE a histogram\na_total 1\n# EOF\n", "line 2: sample a_total in family a (histogram)"),
        ("a 1\n# EOF\n", "line 1: sample a before any family is declared"),
        ("# HELP a say \"hi\"\n# TYPE a gauge\n# EOF\n", "line 1: HELP of a has an unescaped `\"`"),
        ("# HELP a C:\\x\n# TYPE a gauge\n# EOF\n", "line 1: HELP of a has an undefined escape `\\x`"),
        ("# TYPE a gauge\na{l=\"x} 1\n# EOF\n", "line 2: labels of a not closed"),
        ("# TYPE a gauge\na one\n# EOF\n", "line 2: sample a has no number: `one`"),
        (
            "# TYPE a_seconds counter\n# UNIT a_seconds bytes\n# EOF\n",
            "line 2: family a_seconds does not end in its unit bytes",
        ),
    ] {
        assert_eq!(openmetrics_families(exposition), Err(error.to_owned()), "{exposition}");
    }
    // Escapes in help text and labels, a `}` inside a label value.
    let valid =
        "# TYPE a_seconds histogram\n# UNIT a_seconds seconds\n# HELP a_seconds Say \\\"hi\\\" \\\\ \\n.\n\
         a_seconds_bucket{le=\"+Inf\",r=\"}\\\" \"} 1\na_seconds_sum 0.5\na_seconds_count 1\n\
         # TYPE b counter\nb_total{r=\"x\"} 2\nb_created 1.5e9\n# EOF\n";
    let parsed = openmetrics_families(valid).unwrap();
    assert_eq!(
        parsed,
        BTreeMap::from([("a_seconds".into(), "histogram".into()), ("b".into(), "counter".into())])
    );
}

/// A `serve` whose `/metrics` holds every family: two rules decided by
/// `redis` (so the fallback's `slidegate_store_states` too), a proxy to
/// `upstream` and an access log written to `log`.
fn serve_config(redis: &RedisServer, upstream: &Upstream, log: &std::path::Path) -> String {
    format!(
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
        head = keyed_head(upstream.addr, "admin_on_public = true", &redis_decides(redis)),
        log = log.display(),
    )
}

/// The families of an OpenMetrics text exposition, by name, with their
/// types, read as the OpenMetrics 1.0 ABNF reads them: or the first line
/// it refuses, and why.
///
/// What it checks is what a strict ingestor refuses a scrape for: one
/// `# EOF` line, last; no empty line; `# TYPE`, `# HELP`, `# UNIT` at most
/// once per family, before its samples, each family declared once (a
/// family's metadata after its samples would start it again); a family
/// name without a counter's `_total` (a sample's suffix, never a family's);
/// every sample declared by a `# TYPE` and named as its family's type
/// allows (a counter's `_total` and `_created`, a histogram's `_bucket`,
/// `_sum`, `_count` and `_created`, a gauge's own name); help text with its
/// `"` and `\` escaped; closed labels and a number after each sample.
fn openmetrics_families(text: &str) -> Result<BTreeMap<String, String>, String> {
    let Some(body) = text.strip_suffix("# EOF\n") else {
        return Err("the text does not end with `# EOF\\n`".into());
    };
    if !body.is_empty() && !body.ends_with('\n') {
        return Err("`# EOF` is not on a line of its own".into());
    }
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    // The family being read: its name, the metadata lines it had, and
    // whether a sample of it came yet.
    let mut current: Option<(String, BTreeSet<String>, bool)> = None;
    for (index, line) in body.lines().enumerate() {
        let at = |what: String| format!("line {}: {what}", index + 1);
        if line.is_empty() {
            return Err(at("an empty line".into()));
        }
        if line == "# EOF" {
            return Err(at("`# EOF` before the end".into()));
        }
        if let Some(metadata) = line.strip_prefix("# ") {
            let mut parts = metadata.splitn(3, ' ');
            let (kind, name, value) = (parts.next().unwrap(), parts.next().unwrap_or(""), parts.next());
            let Some(value) = value else { return Err(at(format!("metadata without a value: `{line}`"))) };
            if !is_metric_name(name) {
                return Err(at(format!("`{name}` is not a metric name")));
            }
            if name.ends_with("_total") {
                return Err(at(format!("family {name} is named with its samples' `_total`")));
            }
            let same = current.as_ref().is_some_and(|(family, _, sampled)| family == name && !sampled);
            if !same {
                if families.contains_key(name) || current.as_ref().is_some_and(|(family, ..)| family == name)
                {
                    return Err(at(format!("family {name} declared twice")));
                }
                families.insert(name.to_owned(), "unknown".into());
                current = Some((name.to_owned(), BTreeSet::new(), false));
            }
            let (_, seen, _) = current.as_mut().unwrap();
            if !seen.insert(kind.to_owned()) {
                return Err(at(format!("a second {kind} line for family {name}")));
            }
            match kind {
                "TYPE" => {
                    const TYPES: [&str; 8] = [
                        "counter",
                        "gauge",
                        "histogram",
                        "gaugehistogram",
                        "stateset",
                        "info",
                        "summary",
                        "unknown",
                    ];
                    if !TYPES.contains(&value) {
                        return Err(at(format!("family {name} has no type `{value}`")));
                    }
                    families.insert(name.to_owned(), value.to_owned());
                }
                "HELP" => escaped(value).map_err(|err| at(format!("HELP of {name} has {err}")))?,
                "UNIT" => {
                    if !value.is_empty() && !name.ends_with(&format!("_{value}")) {
                        return Err(at(format!("family {name} does not end in its unit {value}")));
                    }
                }
                _ => return Err(at(format!("a `#` line that is not TYPE, HELP, UNIT or EOF: `{line}`"))),
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let Some((family, _, sampled)) = current.as_mut() else {
            return Err(at(format!("sample {name} before any family is declared")));
        };
        let kind = families[family.as_str()].as_str();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        if !suffixes.iter().any(|suffix| name.strip_suffix(suffix) == Some(family.as_str())) {
            return Err(at(format!("sample {name} in family {family} ({kind})")));
        }
        *sampled = true;
        let mut rest = &line[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            let end = labels_end(labels).ok_or_else(|| at(format!("labels of {name} not closed")))?;
            rest = &labels[end + 1..];
        }
        let number = rest.strip_prefix(' ').unwrap_or(rest).split(' ').next().unwrap_or("");
        let inf = ["+Inf", "-Inf", "NaN"].contains(&number);
        if !inf && number.parse::<f64>().is_err() {
            return Err(at(format!("sample {name} has no number: `{number}`")));
        }
    }
    Ok(families)
}

/// Whether `name` is a metric name: letters, digits, `_` and `:`, not
/// starting with a digit.
fn is_metric_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `text` is an escaped string: no raw `"`, and a `\` only before
/// `n`, `"` or `\` (the ABNF allows `\` before any other character too,
/// but says it should not be used: a parser may read it either way).
fn escaped(text: &str) -> Result<(), String> {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Err("an unescaped `\"`".into()),
            '\\' => match chars.next() {
                Some('n' | '"' | '\\') => {}
                other => {
                    return Err(format!(
                        "an undefined escape `\\{}`",
                        other.map(String::from).unwrap_or_default()
                    ))
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// Where the `}` closing the labels that start `labels` is, skipping quoted
/// values and their escapes.
fn labels_end(labels: &str) -> Option<usize> {
    let mut quoted = false;
    let mut chars = labels.char_indices();
    while let Some((at, c)) = chars.next() {
        match (c, quoted) {
            ('"', _) => quoted = !quoted,
            ('\\', true) => {
                chars.next();
            }
            ('}', false) => return Some(at),
            _ => {}
        }
    }
    None
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
