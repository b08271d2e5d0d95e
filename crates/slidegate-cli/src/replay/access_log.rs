//! One line of an access log, read into the request it records: a line that
//! starts with `{` is a JSON object, any other the combined format nginx and
//! Apache write by default.
//!
//! - Combined: `IP - user [10/Oct/2000:13:55:36 -0700] "GET /path?q HTTP/1.1" 200 2326 "ref" "ua"`.
//!   The client is the first field; there is no API key.
//! - JSON lines: `time` (RFC 3339, or unix seconds, or milliseconds from
//!   10^11 on), `method`, `path` (with its query), `ip`, and optionally
//!   `api_key` (the raw key), `api_key_hash` (a key as the application logs
//!   it, hashed: used as an opaque key, so each hash is one client with its
//!   own quota) and `status`. Other fields are ignored.
//!
//! A line that does not read is an `Err` saying why, never a panic: the
//! reasons quote at most 40 characters of a bad value, and never a key.

use std::net::IpAddr;

use http::{HeaderValue, Method, StatusCode};
use serde_json::Value;

use super::clip::clip;
use super::timestamp;

/// A request as a log line records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When, in ms since the Unix epoch.
    pub time_ms: u64,
    pub method: Method,
    /// The request target in origin form: the path and its query.
    pub target: String,
    /// The client's address.
    pub ip: IpAddr,
    /// The API key to send in the configured key header: the raw key, or
    /// the logged hash standing for it.
    pub key: Option<HeaderValue>,
    /// The response's status, when the line has one.
    pub status: Option<StatusCode>,
}

/// Reads one line (without its line ending).
pub fn parse(line: &[u8]) -> Result<Entry, String> {
    let line = std::str::from_utf8(line).map_err(|e| format!("not UTF-8 text (byte {})", e.valid_up_to()))?;
    // A byte order mark, as some Windows tools begin a file with.
    let line = line.strip_prefix('\u{feff}').unwrap_or(line);
    if line.starts_with('{') {
        parse_json(line)
    } else {
        parse_combined(line)
    }
}

fn parse_combined(line: &str) -> Result<Entry, String> {
    let (ip, rest) =
        line.split_once(' ').ok_or("not a combined-format line: no space after the client address")?;
    let ip = parse_ip(ip)?;
    let open = rest.find('[').ok_or("no [time] field")?;
    let close = rest[open..].find(']').ok_or("the [time] field has no closing ]")? + open;
    let time_ms = timestamp::parse_common_log(&rest[open + 1..close])?;
    let rest = rest[close + 1..].trim_start();
    let quoted = rest.strip_prefix('"').ok_or("no quoted request line after the time")?;
    let end = quoted.find('"').ok_or("the request line has no closing quote")?;
    let (method, target) = parse_request_line(&quoted[..end])?;
    let status = match quoted[end + 1..].split_whitespace().next() {
        None | Some("-") => None,
        Some(s) => Some(parse_status(s)?),
    };
    Ok(Entry { time_ms, method, target, ip, key: None, status })
}

/// `GET /path?q HTTP/1.1` (the protocol may be missing, as in HTTP/0.9).
fn parse_request_line(request: &str) -> Result<(Method, String), String> {
    if request == "-" {
        return Err("no request line (\"-\": the client sent none)".to_owned());
    }
    let mut parts = request.split(' ');
    let (Some(method), Some(target), None | Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("request line {:?} is not METHOD TARGET PROTOCOL", clip(request)));
    };
    Ok((parse_method(method)?, parse_target(target)?))
}

fn parse_json(line: &str) -> Result<Entry, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".to_owned());
    };
    let string = |name: &str| match fields.get(name) {
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        None | Some(Value::Null) => Ok(None),
        Some(other) => Err(format!("field {name:?} must be a string, got {}", kind(other))),
    };
    let required = |name: &str| string(name)?.ok_or_else(|| format!("field {name:?} is missing"));
    let time_ms = match fields.get("time") {
        Some(Value::String(s)) => timestamp::parse_rfc3339(s)?,
        Some(Value::Number(n)) => timestamp::from_unix(n.as_f64().unwrap_or(f64::NAN))?,
        None => return Err("field \"time\" is missing".to_owned()),
        Some(other) => {
            return Err(format!(
                "field \"time\" must be an RFC 3339 string or unix seconds or milliseconds, got {}",
                kind(other)
            ))
        }
    };
    let method = parse_method(required("method")?)?;
    let target = parse_target(required("path")?)?;
    let ip = parse_ip(required("ip")?)?;
    let key = match (string("api_key")?, string("api_key_hash")?) {
        (Some(key), _) | (None, Some(key)) if !key.is_empty() => Some(
            HeaderValue::from_bytes(key.as_bytes())
                .map_err(|_| "the API key has characters no header can carry".to_owned())?,
        ),
        _ => None,
    };
    let status = match fields.get("status") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(parse_status(&n.to_string())?),
        Some(other) => return Err(format!("field \"status\" must be a number, got {}", kind(other))),
    };
    Ok(Entry { time_ms, method, target, ip, key, status })
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("client address {:?} is not an IP address", clip(s)))
}

fn parse_method(s: &str) -> Result<Method, String> {
    Method::from_bytes(s.as_bytes()).map_err(|_| format!("method {:?} is not an HTTP method", clip(s)))
}

/// The path and query of an origin-form target (`/a?b`), or of an
/// absolute-form one (`http://host/a?b`, as a forward proxy logs it).
fn parse_target(s: &str) -> Result<String, String> {
    let path = match s.split_once("://") {
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
        {
            rest.find('/').map_or("/", |i| &rest[i..])
        }
        _ => s,
    };
    if !path.starts_with('/') {
        return Err(format!("target {:?} is not a path (/...)", clip(s)));
    }
    Ok(path.to_owned())
}

fn parse_status(s: &str) -> Result<StatusCode, String> {
    s.parse::<u16>()
        .ok()
        .and_then(|n| StatusCode::from_u16(n).ok())
        .ok_or_else(|| format!("status {:?} is not an HTTP status (100 to 999)", clip(s)))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_796_119_200_000;

    #[test]
    fn a_combined_line_reads_whole() {
        let line = br#"2001:db8::7 - alice [01/Dec/2026:11:00:00 +0100] "POST /api/items?page=2 HTTP/2.0" 429 12 "-" "curl/8""#;
        let e = parse(line).unwrap();
        assert_eq!(e.time_ms, T);
        assert_eq!(e.method, Method::POST);
        assert_eq!(e.target, "/api/items?page=2");
        assert_eq!(e.ip, "2001:db8::7".parse::<IpAddr>().unwrap());
        assert_eq!((e.key, e.status), (None, Some(StatusCode::TOO_MANY_REQUESTS)));
        // The common format without referrer and agent, an absolute-form target, no protocol.
        let e = parse(br#"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] "GET http://example.com/x?y""#).unwrap();
        assert_eq!((e.target.as_str(), e.status), ("/x?y", None));
        let e = parse(br#"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] "GET https://example.com" - -"#).unwrap();
        assert_eq!(e.target, "/");
    }

    #[test]
    fn a_json_line_reads_keys_hashes_and_statuses() {
        let e = parse(br#"{"time":"2026-12-01T10:00:00Z","method":"GET","path":"/a","ip":"10.0.0.1","api_key":"k1","status":200,"ua":"x"}"#).unwrap();
        assert_eq!(
            (e.time_ms, e.key.unwrap(), e.status),
            (T, HeaderValue::from_static("k1"), Some(StatusCode::OK))
        );
        let e = parse(br#"{"time":1796119200,"method":"GET","path":"/a","ip":"10.0.0.1","api_key_hash":"ab12","api_key":null}"#).unwrap();
        assert_eq!(e.key.unwrap(), "ab12");
        let e = parse(br#"{"time":1796119200000,"method":"GET","path":"/a","ip":"10.0.0.1","api_key":""}"#)
            .unwrap();
        assert_eq!((e.time_ms, e.key), (T, None));
    }

    #[test]
    fn hostile_lines_are_errors_that_say_why() {
        for (line, why) in [
            (&b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET /a HTTP/1.1"[..], "closing quote"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000 \"GET /a HTTP/1.1\" 200 1", "closing ]"),
            (b"10.0.0.1 - - 01/Dec/2026:10:00:00 +0000 \"GET /a HTTP/1.1\" 200 1", "[time]"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] GET /a HTTP/1.1 200 1", "quoted request"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET  /a HTTP/1.1\" 200 1", "METHOD TARGET"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET /a HTTP/1.1 x\" 200 1", "METHOD TARGET"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"G(T /a HTTP/1.1\" 200 1", "method"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET a HTTP/1.1\" 200 1", "not a path"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET /a HTTP/1.1\" 1000 1", "status"),
            (b"10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET /a HTTP/1.1\" 99 1", "status"),
            (b"localhost - - [01/Dec/2026:10:00:00 +0000] \"GET /a HTTP/1.1\" 200 1", "not an IP"),
            (b"10.0.0.1", "no space"),
            (b"\xc3\x28", "UTF-8"),
            (b"{\"time\": 1796119200", "JSON"),
            (b"{\"time\": 1796119200, \"method\": \"GET\", \"path\": \"/a\", \"ip\": 7}", "\"ip\" must be a string"),
            (b"{\"time\": [], \"method\": \"GET\", \"path\": \"/a\", \"ip\": \"10.0.0.1\"}", "an array"),
            (b"{\"time\": 1796119200, \"path\": \"/a\", \"ip\": \"10.0.0.1\"}", "\"method\" is missing"),
            (b"{\"time\": 1796119200, \"method\": \"GET\", \"path\": \"/a\", \"ip\": \"10.0.0.1\", \"status\": 1.5}", "status"),
            (b"{\"time\": 1796119200, \"method\": \"GET\", \"path\": \"/a\", \"ip\": \"10.0.0.1\", \"api_key\": \"\\u0000\"}", "header"),
        ] {
            let err = parse(line).unwrap_err();
            assert!(err.contains(why), "{:?}: {err}", String::from_utf8_lossy(line));
        }
        let deep = format!("{{\"a\":{}", "[".repeat(100_000));
        assert!(
            parse(deep.as_bytes()).unwrap_err().contains("JSON"),
            "nesting is bounded, not a stack overflow"
        );
        let e = parse(
            b"\xef\xbb\xbf{\"time\":1796119200,\"method\":\"GET\",\"path\":\"/a\",\"ip\":\"10.0.0.1\"}",
        );
        assert_eq!(e.map(|e| e.time_ms), Ok(T), "a byte order mark is skipped");
        let long = format!("{} - - [x]", "9".repeat(1000));
        assert!(parse(long.as_bytes()).unwrap_err().len() < 100, "a bad value is clipped");
        let secret = br#"{"time": 1796119200, "method": "GET", "path": "/a", "ip": "10.0.0.1", "api_key": "sk_\u0001secret"}"#;
        assert!(!parse(secret).unwrap_err().contains("secret"), "a key is never quoted");
    }
}
