//! The top offenders on the admin listener: `GET /v1/offenders` (JSON) and
//! `GET /offenders`, a page an operator opens in a browser.
//!
//! The page is served whole by slidegate: no build step and no external
//! asset, so it works on an admin port with no way out. It is rendered on the
//! server (readable without JavaScript) and a small inline script refreshes
//! the table from the JSON every few seconds. Every value is escaped on the
//! server and set with `textContent` in the browser; a Content-Security-Policy
//! allows nothing but the inline style and script and fetches to itself.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;
use slidegate_http::offenders::{Offender, Offenders, CAPACITY, MINUTES};

use super::{full, ServeBody, State};

/// The most entries one query may ask for: every entry of every minute.
const MAX_LIMIT: usize = CAPACITY * MINUTES;
const DEFAULT_LIMIT: usize = 20;
/// How often the page refreshes itself.
const REFRESH_MS: u64 = 5_000;

/// What a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Query {
    minutes: usize,
    limit: usize,
}

impl Query {
    /// Parses `minutes=1..5&limit=1..320`; both optional.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut parsed = Query { minutes: MINUTES, limit: DEFAULT_LIMIT };
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (slot, max) = match name {
                "minutes" => (&mut parsed.minutes, MINUTES),
                "limit" => (&mut parsed.limit, MAX_LIMIT),
                _ => return Err(format!("unknown query parameter {name:?}: expected minutes or limit")),
            };
            *slot = value
                .parse()
                .ok()
                .filter(|v| (1..=max).contains(v))
                .ok_or_else(|| format!("{name}={value:?}: expected a whole number from 1 to {max}"))?;
        }
        Ok(parsed)
    }
}

/// One offender as the JSON shows it.
#[derive(Debug, Serialize)]
struct Row {
    /// 16 hex digits of the identity's keyed hash.
    identity: String,
    /// The full form, `k:<32 hex>` or `ip:<32 hex>`: what `DELETE
    /// /v1/penalty/{id}` takes.
    id: String,
    /// `"api_key"` or `"ip"`.
    kind: &'static str,
    rule: String,
    /// Refusals over the window (an upper bound).
    denials: u64,
    /// How much `denials` may overcount; 0 when exact.
    error: u64,
    blocked_until_unix_ms: Option<u64>,
    blocked_for_ms: Option<u64>,
}

/// One network as the JSON shows it.
#[derive(Debug, Serialize)]
struct NetworkRow {
    /// `203.0.113.0/24` or `2001:db8:1::/48`.
    network: String,
    rule: String,
    denials: u64,
    error: u64,
}

/// The `/v1/offenders` answer.
#[derive(Debug, Serialize)]
struct Answer {
    minutes: usize,
    capacity_per_minute: usize,
    /// Whether `offenders` ranks anything; `false` under identity rotation,
    /// when every count is mostly error: read `networks` then.
    ranked: bool,
    offenders: Vec<Row>,
    /// The same refusals by client network (/24, /48).
    networks: Vec<NetworkRow>,
}

fn network_rows(state: &State, query: Query) -> Vec<NetworkRow> {
    let limiter = state.limiter();
    let names = limiter.rule_names();
    let offenders = limiter.offenders();
    offenders
        .top_networks(query.minutes, query.limit)
        .into_iter()
        .map(|n| NetworkRow {
            network: n.network.to_string(),
            rule: names.get(n.rule).map_or_else(String::new, |r| (*r).to_owned()),
            denials: n.denials,
            error: n.error,
        })
        .collect()
}

/// The top list and whether it ranks anything.
fn ranked_rows(state: &State, query: Query) -> (bool, Vec<Row>) {
    let top = state.limiter().offenders().top(query.minutes, query.limit);
    (Offenders::ranked(&top), rows(state, top))
}

fn rows(state: &State, top: Vec<Offender>) -> Vec<Row> {
    let limiter = state.limiter();
    let names = limiter.rule_names();
    let now = SystemTime::now();
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    top.into_iter()
        .map(|o: Offender| Row {
            identity: o.identity.short_hex(),
            id: o.identity.id(),
            kind: o.identity.kind().as_str(),
            rule: names.get(o.rule).map_or_else(String::new, |n| (*n).to_owned()),
            denials: o.denials,
            error: o.error,
            blocked_until_unix_ms: o.blocked_until.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(ms),
            blocked_for_ms: o.blocked_until.and_then(|t| t.duration_since(now).ok()).map(ms),
        })
        .collect()
}

/// `GET /v1/offenders`.
pub(crate) fn json(state: &State, query: Query) -> Response<ServeBody> {
    let (ranked, offenders) = ranked_rows(state, query);
    let answer = Answer {
        minutes: query.minutes,
        capacity_per_minute: CAPACITY,
        ranked,
        offenders,
        networks: network_rows(state, query),
    };
    let body = serde_json::to_string(&answer).unwrap_or_default();
    respond(body, "application/json")
}

/// `GET /offenders`.
pub(crate) fn page(state: &State, query: Query) -> Response<ServeBody> {
    let mut table = String::new();
    let (ranked, rows) = ranked_rows(state, query);
    for row in &rows {
        let _ = write!(
            table,
            "<tr><td>{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td{}>{}</td><td class=\"mono\">{}</td></tr>",
            escape(&row.rule),
            escape(&row.identity),
            row.kind,
            row.denials,
            precision(row.error),
            if row.blocked_for_ms.is_some() { " class=\"blocked\"" } else { "" },
            block_state(row.blocked_for_ms),
            escape(&row.id),
        );
    }
    if rows.is_empty() {
        table.push_str(EMPTY_ROW);
    }
    let mut networks = String::new();
    let network_rows = network_rows(state, query);
    for row in &network_rows {
        let _ = write!(
            networks,
            "<tr><td>{}</td><td class=\"mono\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            escape(&row.rule),
            escape(&row.network),
            row.denials,
            precision(row.error),
        );
    }
    if network_rows.is_empty() {
        networks.push_str(EMPTY_NETWORK_ROW);
    }
    let body = PAGE
        .replace("{MINUTES}", &query.minutes.to_string())
        .replace("{UNRANKED_HIDDEN}", if ranked { " hidden" } else { "" })
        .replace("{CAPACITY}", &CAPACITY.to_string())
        .replace("{NETWORK_ROWS}", &networks)
        .replace("{ROWS}", &table)
        .replace("{QUERY}", &format!("?minutes={}&limit={}", query.minutes, query.limit))
        .replace("{REFRESH_MS}", &REFRESH_MS.to_string());
    let mut response = respond(body, "text/html; charset=utf-8");
    response.headers_mut().insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    response
}

fn precision(error: u64) -> String {
    if error == 0 {
        "exact".to_owned()
    } else {
        format!("at most {error} over")
    }
}

fn block_state(blocked_for_ms: Option<u64>) -> String {
    match blocked_for_ms {
        Some(ms) => format!("blocked, {} s left", ms.div_ceil(1000)),
        None => "not blocked".to_owned(),
    }
}

fn respond(body: String, content_type: &'static str) -> Response<ServeBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Escapes text for HTML content and quoted attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const EMPTY_ROW: &str = "<tr><td colspan=\"7\" class=\"empty\">no refusals in this window</td></tr>";
const EMPTY_NETWORK_ROW: &str = "<tr><td colspan=\"4\" class=\"empty\">no refusals in this window</td></tr>";

/// The page. The script mirrors the server's rendering of a row; it builds
/// the DOM with `textContent`, never HTML strings.
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>slidegate: top offenders</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2rem; color: #1d1d1f; background: #fafafa; }
h1 { font-size: 1.3rem; margin: 0 0 .25rem; }
p { margin: .25rem 0 1rem; color: #555; }
table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
th, td { padding: .4rem .8rem; border-bottom: 1px solid #e5e5e5; text-align: left; }
th { background: #f0f0f3; font-weight: 600; }
.mono { font-family: ui-monospace, monospace; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.blocked { color: #b00020; font-weight: 600; }
.empty { color: #777; font-style: italic; }
.warn { color: #8a4b00; background: #fff4e0; padding: .5rem .8rem; border-left: 3px solid #e69500; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .25rem; }
</style>
</head>
<body>
<h1>Top offenders</h1>
<p>Identities refused most over the last {MINUTES} minute(s), as keyed hashes: never raw keys or addresses. <span id="status">Rendered by the server.</span></p>
<p id="unranked" class="warn"{UNRANKED_HIDDEN}>These counts cannot rank anyone: refusals are spread over more identities than the {CAPACITY} a minute this list tracks (identity rotation), so each count is mostly error. Read the same refusals by network below.</p>
<table>
<thead><tr><th>rule</th><th>identity</th><th>kind</th><th class="num">denials</th><th>count</th><th>block</th><th>id (DELETE /v1/penalty/{id})</th></tr></thead>
<tbody id="rows">{ROWS}</tbody>
</table>
<h2>By network</h2>
<p>The same refusals summed per client network: the /24 of an IPv4 address, the /48 of an IPv6 one.</p>
<table>
<thead><tr><th>rule</th><th>network</th><th class="num">denials</th><th>count</th></tr></thead>
<tbody id="networks">{NETWORK_ROWS}</tbody>
</table>
<script>
(function () {
  "use strict";
  var rows = document.getElementById("rows");
  var networks = document.getElementById("networks");
  var unranked = document.getElementById("unranked");
  var status = document.getElementById("status");
  function precision(error) { return error === 0 ? "exact" : "at most " + error + " over"; }
  function empty(columns) {
    var tr = document.createElement("tr");
    cell(tr, "no refusals in this window", "empty");
    tr.firstChild.colSpan = columns;
    return tr;
  }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    tr.appendChild(td);
  }
  function refresh() {
    fetch("v1/offenders{QUERY}", { cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (data) {
        var fresh = document.createDocumentFragment();
        data.offenders.forEach(function (o) {
          var tr = document.createElement("tr");
          var blocked = o.blocked_for_ms !== null;
          cell(tr, o.rule);
          cell(tr, o.identity, "mono");
          cell(tr, o.kind);
          cell(tr, String(o.denials), "num");
          cell(tr, precision(o.error));
          cell(tr, blocked ? "blocked, " + Math.ceil(o.blocked_for_ms / 1000) + " s left" : "not blocked", blocked ? "blocked" : "");
          cell(tr, o.id, "mono");
          fresh.appendChild(tr);
        });
        if (data.offenders.length === 0) { fresh.appendChild(empty(7)); }
        rows.replaceChildren(fresh);
        var byNetwork = document.createDocumentFragment();
        data.networks.forEach(function (n) {
          var tr = document.createElement("tr");
          cell(tr, n.rule);
          cell(tr, n.network, "mono");
          cell(tr, String(n.denials), "num");
          cell(tr, precision(n.error));
          byNetwork.appendChild(tr);
        });
        if (data.networks.length === 0) { byNetwork.appendChild(empty(4)); }
        networks.replaceChildren(byNetwork);
        unranked.hidden = data.ranked;
        status.textContent = "Refreshed " + new Date().toLocaleTimeString() + ", every " + {REFRESH_MS} / 1000 + " s.";
      })
      .catch(function (e) { status.textContent = "Refresh failed: " + e.message; });
  }
  refresh();
  setInterval(refresh, {REFRESH_MS});
})();
</script>
</body>
</html>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_and_refuses_what_is_out_of_range() {
        assert_eq!(Query::parse(None), Ok(Query { minutes: 5, limit: 20 }));
        assert_eq!(Query::parse(Some("minutes=2&limit=3")), Ok(Query { minutes: 2, limit: 3 }));
        for bad in ["minutes=0", "minutes=6", "limit=0", "limit=321", "limit=x", "other=1", "minutes"] {
            assert!(Query::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn shows_the_block_state_and_the_precision() {
        assert_eq!(block_state(None), "not blocked");
        assert_eq!(block_state(Some(1)), "blocked, 1 s left");
        assert_eq!(block_state(Some(90_000)), "blocked, 90 s left");
        assert_eq!((precision(0).as_str(), precision(3).as_str()), ("exact", "at most 3 over"));
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        let lower = PAGE.to_ascii_lowercase();
        for external in ["http:", "https:", "//", " src=", " href="] {
            assert!(!lower.contains(external), "{external}");
        }
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape(r#"<a href="x">'&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
    }
}
