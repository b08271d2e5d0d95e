//! TLS end to end: certificates made at test time with `openssl`, a real
//! `slidegate serve` with `[server] tls`, curl and rustls clients, and an
//! upstream over TLS (`https://`, checked against `upstream_ca`). What a
//! bad file, an unverifiable upstream, a reload, a hostile client and a
//! Redis outage do.

#![allow(clippy::unwrap_used)]

mod common;
mod protocols;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::*;
use protocols::*;

const RULES: &str = r#"
[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 2, window = "60s", algorithm = "sliding_log" }]
"#;

/// `tls = { ... }` for `certs`' server certificate.
fn tls_line(certs: &TlsCerts) -> String {
    format!("tls = {{ cert = {:?}, key = {:?} }}", certs.server_cert, certs.server_key)
}

fn start(upstream: &str, server: &str, store: &str) -> Slidegate {
    Slidegate::start(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"{upstream}\"\nthreads = 1\n{server}\n\n{store}\n\
         [identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n{RULES}"
    ))
}

fn https(sg: &Slidegate, path: &str) -> String {
    format!("https://localhost:{}{path}", sg.addr.port())
}

fn curl_tls(certs: &TlsCerts, sg: &Slidegate, extra: &[&str], path: &str) -> Curl {
    let ca = certs.ca_cert.to_str().unwrap().to_owned();
    let resolve = localhost(sg.addr);
    let url = https(sg, path);
    let mut args = vec!["--cacert", &ca, "--resolve", &resolve];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

#[test]
fn the_tls_listener_serves_h2_and_http1_by_alpn_on_tls_1_2_and_1_3() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let upstream = Upstream::start();
    let sg = start(&format!("http://{}", upstream.addr), &tls_line(&certs), "");
    let h2 = curl_tls(&certs, &sg, &["--tlsv1.3"], "/api/search");
    assert_eq!((h2.exit, h2.status, h2.version.as_str()), (0, 200, "2"), "{h2:?}");
    assert_eq!(h2.body, "GET /api/search xff=127.0.0.1");
    assert_eq!(h2.header("ratelimit"), Some("\"search\";r=1;t=60"));
    let h1 = curl_tls(&certs, &sg, &["--http1.1", "--tlsv1.2", "--tls-max", "1.2"], "/api/search");
    assert_eq!((h1.status, h1.version.as_str()), (200, "1.1"), "{h1:?}");
    assert_eq!(h1.header("ratelimit"), Some("\"search\";r=0;t=60"));
    let denied = curl_tls(&certs, &sg, &[], "/api/search");
    assert_eq!((denied.status, denied.header("retry-after")), (429, Some("60")));
    // TLS 1.1 is refused.
    let old = curl_tls(&certs, &sg, &["--tlsv1.1", "--tls-max", "1.1"], "/x");
    assert_ne!(old.exit, 0, "{old:?}");
    assert_eq!(upstream.hits(), 2);
}

/// Runs `check-config` on `text` (in a directory holding `files`); its exit code and stderr.
fn check_config(text: &str) -> (i32, String) {
    let (dir, path) = write_config(text);
    let out = Command::new(binary()).arg("check-config").arg(&path).output().unwrap();
    drop(dir);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_certificate_files_are_located_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let other = TlsCerts::generate(&other);
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let head = "[server]\nupstream = \"https://localhost:9443\"\n";
    let case = |line: String| check_config(&format!("{head}{line}\n"));

    let (code, err) = case(format!(
        "tls = {{ cert = {:?}, key = {:?} }}",
        dir.path().join("missing.crt"),
        certs.server_key
    ));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("slidegate.toml:3:16: tls: cannot read"), "{err}");
    let (code, err) = case(format!("tls = {{ cert = {not_pem:?}, key = {:?} }}", certs.server_key));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("slidegate.toml:3:16: tls: ") && err.contains("no PEM item"), "{err}");
    let (code, err) = case(format!("tls = {{ cert = {:?}, key = {not_pem:?} }}", certs.server_cert));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("expected the PEM private key of the certificate"), "{err}");
    let (code, err) =
        case(format!("tls = {{ cert = {:?}, key = {:?} }}", certs.server_cert, other.server_key));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("is not the key of the certificate"), "{err}");
    let (code, err) = case(format!("upstream_ca = {not_pem:?}"));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("slidegate.toml:3:15: upstream_ca: ") && err.contains("no PEM item"), "{err}");
    let (code, err) = check_config(&format!(
        "[server]\nupstream = \"http://127.0.0.1:9000\"\nupstream_ca = {:?}\n",
        certs.ca_cert
    ));
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("slidegate.toml:3:15: upstream_ca is the CA an https:// upstream"), "{err}");
    let (code, err) =
        case(format!("tls = {{ cert = {:?}, key = {:?} }}", certs.server_cert, certs.server_key));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn an_https_upstream_is_verified_reached_by_its_name_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let upstream = ProtoUpstream::tls("127.0.0.1", &certs);
    let url = format!("https://localhost:{}", upstream.addr.port());
    let ca = format!("upstream_ca = {:?}", certs.ca_cert);
    let sg = start(&url, &ca, "");
    for i in 0..3 {
        let reply = get(sg.addr, &format!("/item/{i}"), &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, format!("GET /item/{i} v=HTTP/1.1 host={} sni=localhost", sg.addr));
    }
    assert_eq!((upstream.hits(), upstream.connections()), (3, 1));
    drop(sg);
    let sg = start(&url, &format!("{ca}\nupstream_http2 = true"), "");
    let reply = curl(&["--http2-prior-knowledge", &format!("http://{}/h2", sg.addr)]);
    assert_eq!(reply.body, format!("GET /h2 v=HTTP/2.0 host={} sni=localhost", sg.addr), "{reply:?}");
}

#[test]
fn an_upstream_that_does_not_verify_gets_a_502_and_nothing_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let upstream = ProtoUpstream::tls("127.0.0.1", &certs);
    let ca = format!("upstream_ca = {:?}", certs.ca_cert);
    // The system roots do not know the test CA.
    let sg = start(&format!("https://localhost:{}", upstream.addr.port()), "admin_on_public = true", "");
    let reply = get(sg.addr, "/a", &[]);
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(sg.metric("slidegate_upstream_tls_failures_total"), 1.0);
    assert!(reply.body.contains("the upstream's TLS could not be verified"), "{}", reply.body);
    wait_for("the failure in the log", Duration::from_secs(5), || {
        sg.log.lock().unwrap().contains("UnknownIssuer")
    });
    drop(sg);
    // The certificate names 127.0.0.1 and localhost, not 127.0.0.2.
    let elsewhere = ProtoUpstream::tls("127.0.0.2", &certs);
    let sg = start(&format!("https://127.0.0.2:{}", elsewhere.addr.port()), &ca, "");
    assert_eq!(get(sg.addr, "/b", &[]).status, 502);
    wait_for("the failure in the log", Duration::from_secs(5), || {
        sg.log.lock().unwrap().contains("certificate not valid for name \"127.0.0.2\"")
    });
    drop(sg);
    // An upstream speaking HTTP in clear on the https:// address.
    let clear = ProtoUpstream::clear("127.0.0.1");
    let sg = start(&format!("https://localhost:{}", clear.addr.port()), &ca, "");
    assert_eq!(get(sg.addr, "/c", &[]).status, 502);
    assert_eq!((upstream.hits(), elsewhere.hits(), clear.hits()), (0, 0, 0));
}

#[test]
fn a_self_signed_upstream_certificate_named_in_upstream_ca_is_pinned() {
    let (own_dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // `openssl req -x509`: a CA:TRUE certificate, the upstream's own.
    let own = TlsCerts::self_signed(own_dir.path());
    let upstream = ProtoUpstream::tls("127.0.0.1", &own);
    let pinned = format!("upstream_ca = {:?}", own.ca_cert);
    let sg = start(&format!("https://localhost:{}", upstream.addr.port()), &pinned, "");
    let reply = get(sg.addr, "/pinned", &[]);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, format!("GET /pinned v=HTTP/1.1 host={} sni=localhost", sg.addr));
    drop(sg);
    // Pinned for its own names only: it names 127.0.0.1 and localhost.
    let elsewhere = ProtoUpstream::tls("127.0.0.2", &own);
    let sg = start(&format!("https://127.0.0.2:{}", elsewhere.addr.port()), &pinned, "");
    assert_eq!(get(sg.addr, "/name", &[]).status, 502);
    wait_for("the failure in the log", Duration::from_secs(5), || {
        sg.log.lock().unwrap().contains("certificate not valid for name \"127.0.0.2\"")
    });
    drop(sg);
    // Another self-signed certificate is not the pinned one.
    let other = TlsCerts::self_signed(other_dir.path());
    let impostor = ProtoUpstream::tls("127.0.0.1", &other);
    let sg = start(&format!("https://localhost:{}", impostor.addr.port()), &pinned, "");
    assert_eq!(get(sg.addr, "/impostor", &[]).status, 502);
    wait_for("the failure and its fix in the log", Duration::from_secs(5), || {
        sg.log
            .lock()
            .unwrap()
            .contains("to pin a self-signed upstream certificate, name that very certificate file")
    });
    assert_eq!((upstream.hits(), elsewhere.hits(), impostor.hits()), (1, 0, 0));
}

/// Copies `from`'s server certificate and key over `to`'s files.
fn install(from: &TlsCerts, to: &TlsCerts) {
    std::fs::copy(&from.server_cert, &to.server_cert).unwrap();
    std::fs::copy(&from.server_key, &to.server_key).unwrap();
}

#[test]
fn a_reload_presents_the_new_certificate_and_keeps_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, live) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("live"));
    for d in [&a, &b, &live] {
        std::fs::create_dir(d).unwrap();
    }
    let (a, b, live) = (TlsCerts::generate(&a), TlsCerts::generate(&b), TlsCerts::generate(&live));
    install(&a, &live);
    let upstream = Upstream::start();
    let server = format!("{}\nadmin_listen = \"127.0.0.1:0\"", tls_line(&live));
    let sg = start(&format!("http://{}", upstream.addr), &server, "");
    let runtime = runtime();
    let addr = sg.addr;
    // One keep-alive connection that trusts the first certificate's CA.
    let mut sender = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = tls_connector(&a.ca_cert, &[b"http/1.1"]).connect(name, tcp).await.unwrap();
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
        tokio::spawn(connection);
        sender
    });
    let mut ask = |path: &str| {
        let request = http::Request::get(path)
            .header("host", "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        // Ready first: the connection may still be reading the last
        // response's body, and hyper cancels a request sent before then.
        // The body is read to its end: one dropped unread may close the
        // connection (hyper cannot reuse it), which the test is not about.
        runtime.block_on(async {
            use http_body_util::BodyExt;
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            response.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        })
    };
    assert_eq!(ask("/before").unwrap(), 200);
    install(&b, &live);
    let reload = request(sg.admin_addr(), "POST", "/admin/reload", &[], b"");
    assert_eq!(reload.status, 200, "{reload:?}");
    // The open connection goes on; new handshakes present the new certificate.
    assert_eq!(ask("/after").unwrap(), 200);
    assert_eq!(curl_tls(&b, &sg, &[], "/new").status, 200);
    let old = curl_tls(&a, &sg, &[], "/old");
    assert_eq!(old.exit, 60, "curl: the certificate does not verify with the old CA: {old:?}");
    // A reload with a bad key changes nothing.
    std::fs::write(&live.server_key, "not a key\n").unwrap();
    let failed = request(sg.admin_addr(), "POST", "/admin/reload", &[], b"");
    assert_eq!(failed.status, 422, "{failed:?}");
    assert!(failed.body.contains("tls: "), "{}", failed.body);
    assert_eq!(curl_tls(&b, &sg, &[], "/still").status, 200);
    assert_eq!(upstream.hits(), 4);
}

/// Writes `bytes` to `addr`; whether the server closed the connection
/// within 15 s (`true`), and what it sent.
fn closes(addr: SocketAddr, bytes: &[u8]) -> (bool, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (true, got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (true, got),
            Err(_) => return (false, got),
        }
    }
}

#[test]
fn plain_http_and_garbage_hellos_on_the_tls_port_are_closed_and_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let upstream = Upstream::start();
    let sg = start(&format!("http://{}", upstream.addr), &tls_line(&certs), "");
    let (closed, got) = closes(sg.addr, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(closed, "plain HTTP kept open");
    assert!(!String::from_utf8_lossy(&got).contains("200"), "{got:?}");
    // A TLS record header for a ClientHello, then noise.
    let (closed, _) =
        closes(sg.addr, &[&[0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c][..], &[0xAB; 60]].concat());
    assert!(closed, "a garbage ClientHello kept open");
    // HTTP/2's preface in clear on the TLS port.
    let (closed, _) = closes(sg.addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert!(closed, "an h2c preface kept open");
    assert_eq!(upstream.hits(), 0);
    assert_eq!(curl_tls(&certs, &sg, &[], "/fine").status, 200);
}

#[test]
fn a_redis_outage_changes_nothing_in_tls_or_h2() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate(dir.path());
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = start(&format!("http://{}", upstream.addr), &tls_line(&certs), &redis_store(&redis));
    let up = curl_tls(&certs, &sg, &[], "/api/search");
    assert_eq!(
        (up.status, up.version.as_str(), up.header("ratelimit")),
        (200, "2", Some("\"search\";r=1;t=60"))
    );
    redis.kill();
    // on_error = "allow": admitted without a count, over the same protocols.
    for extra in [&[][..], &["--http1.1"][..]] {
        let reply = curl_tls(&certs, &sg, extra, "/api/search");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("ratelimit"), None, "{reply:?}");
    }
    assert_eq!(curl_tls(&certs, &sg, &[], "/other").version, "2");
    assert_eq!(upstream.hits(), 4);
}
