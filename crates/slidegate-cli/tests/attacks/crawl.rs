//! Scrapers that stay under every request rate: a catalogue walk at a
//! polite pace (crawl breadth), enumeration probes that only show as 404s
//! (status-based counting), and cheap-looking requests that are expensive
//! upstream (a cost the upstream sets).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

#[allow(unused_imports)]
use crate::common::*;

/// Breadth windows are aligned to multiples of the window since the epoch
/// (10 minutes here): a walk that crosses one's end starts counting afresh
/// and is admitted past its breadth. Each breadth test starts clear of an
/// end by `margin` (a test takes seconds), waiting for the next window if
/// the current one ends sooner.
fn clear_of_a_window_end(margin: std::time::Duration) {
    const WINDOW_MS: u128 = 600_000;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let left = WINDOW_MS - now.as_millis() % WINDOW_MS;
    if left < margin.as_millis() {
        std::thread::sleep(std::time::Duration::from_millis(left as u64 + 50));
    }
}

#[test]
fn a_catalogue_walk_is_denied_past_its_breadth_on_redis() {
    clear_of_a_window_end(std::time::Duration::from_secs(60));
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let config = format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "videos"
path = "/api/videos/{{id}}"
limits = [{{ limit = 100000, window = "60s" }}]
breadth = {{ distinct = 200, window = "10m", of = "param:id" }}
"#,
        // A generous deadline: an id admitted while a call timed out (breadth
        // steps aside) is not in the sketch, and its re-visit below would
        // count as new; a loaded CI machine misses 50 ms now and then.
        head = config_head(
            upstream.addr,
            "",
            &redis_store(&redis).replace("timeout_ms = 50", "timeout_ms = 5000")
        ),
    );
    let gate = Slidegate::start(&config);
    let mut first_denied = None;
    let mut admitted = Vec::new();
    for id in 1..=300u32 {
        let reply = gate.get(&format!("/api/videos/{id}"), &[]);
        match reply.status {
            200 => admitted.push(id),
            429 => {
                if first_denied.is_none() {
                    first_denied = Some(id);
                    assert_eq!(reply.header("ratelimit-policy"), Some("\"videos-breadth\";q=200;w=600"));
                    assert!(reply
                        .header("ratelimit")
                        .is_some_and(|h| h.starts_with("\"videos-breadth\";r=0;t=")));
                    let wait: u64 = reply.header("retry-after").unwrap().parse().unwrap();
                    assert!((1..=600).contains(&wait), "retry-after {wait}");
                }
            }
            other => panic!("status {other} for id {id}"),
        }
    }
    // HyperLogLog at 200 values: the estimate is within ±1.5 %, and a new id
    // whose register already holds its rank is taken for one seen (about 1
    // in 100 at this size). Denied requests never reach the upstream.
    let first = first_denied.expect("the walk was denied");
    assert!((195..=206).contains(&first), "first denial at id {first}");
    assert!((195..=210).contains(&admitted.len()), "{} admitted", admitted.len());
    assert_eq!(upstream.hits(), admitted.len());
    // Re-visits stay allowed: the limit is on breadth, not on requests.
    for id in admitted.iter().take(20) {
        assert_eq!(gate.get(&format!("/api/videos/{id}"), &[]).status, 200, "seen id {id}");
    }
    // Same ids spelled differently are the same values.
    assert_eq!(gate.get(&format!("/api/videos//{}", admitted[0]), &[]).status, 200);
}

/// An upstream answering 404 for `/api/users/missing*`, and a cost header
/// for `/api/search*` (`x-ratelimit-cost: 5`, or 0 under `/api/search/cached`).
fn pricing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let counter = Arc::clone(&counter);
            thread::spawn(move || answer(stream, &counter));
        }
    });
    (addr, hits)
}

fn answer(stream: TcpStream, hits: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some((line, headers)) = read_head(&mut reader) {
        let _ = read_body(&mut reader, &headers);
        hits.fetch_add(1, Ordering::SeqCst);
        let target = line.split(' ').nth(1).unwrap_or("").to_owned();
        let (status, extra) = if target.starts_with("/api/users/missing") {
            ("404 Not Found", "")
        } else if target.starts_with("/api/search/cached") {
            ("200 OK", "x-ratelimit-cost: 0\r\n")
        } else if target.starts_with("/api/search") {
            ("200 OK", "x-ratelimit-cost: 5\r\n")
        } else {
            ("200 OK", "")
        };
        let head = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n{extra}\r\n");
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(b"ok")).is_err() {
            return;
        }
    }
}

fn pricing_config(upstream: SocketAddr, store: &str) -> String {
    format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "users"
path = "/api/users/*"
limits = [{{ limit = 3, window = "60s", algorithm = "sliding_log" }}]
count_status = [404]

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 10, window = "60s", algorithm = "sliding_log" }}]
cost_header = "x-ratelimit-cost"
max_cost = 10
"#,
        head = config_head(upstream, "", store),
    )
}

fn enumeration_probes_count_and_successes_do_not(store: &str, upstream: SocketAddr, hits: &AtomicUsize) {
    let gate = Slidegate::start(&pricing_config(upstream, store));
    for i in 0..10 {
        let ok = gate.get(&format!("/api/users/{i}"), &[]);
        assert_eq!((ok.status, remaining(&ok)), (200, Some(3)), "a 200 never counts");
    }
    for (i, left) in [(1, 2), (2, 1), (3, 0)] {
        let probe = gate.get(&format!("/api/users/missing{i}"), &[]);
        assert_eq!((probe.status, remaining(&probe)), (404, Some(left)), "probe {i}");
    }
    let before = hits.load(Ordering::SeqCst);
    let denied = gate.get("/api/users/7", &[]);
    assert_eq!(denied.status, 429, "the request after the 3rd 404 is refused");
    assert!(denied.header("retry-after").is_some());
    assert_eq!(hits.load(Ordering::SeqCst), before, "a denial never reaches the upstream");

    // The upstream prices searches: 5 of 10, then a free cached one, then 5
    // more, then nothing left.
    let first = gate.get("/api/search?q=a", &[]);
    assert_eq!((first.status, remaining(&first)), (200, Some(5)));
    let cached = gate.get("/api/search/cached?q=a", &[]);
    assert_eq!((cached.status, remaining(&cached)), (200, Some(5)), "the next request sees remaining 5");
    let second = gate.get("/api/search?q=b", &[]);
    assert_eq!((second.status, remaining(&second)), (200, Some(0)));
    assert_eq!(gate.get("/api/search?q=c", &[]).status, 429);
}

#[test]
fn responses_are_counted_by_status_and_priced_by_the_upstream_embedded() {
    let (upstream, hits) = pricing_upstream();
    enumeration_probes_count_and_successes_do_not("", upstream, &hits);
}

#[test]
fn responses_are_counted_by_status_and_priced_by_the_upstream_on_redis() {
    let redis = RedisServer::spawn();
    let (upstream, hits) = pricing_upstream();
    enumeration_probes_count_and_successes_do_not(&redis_decides(&redis), upstream, &hits);
}

/// A breadth rule on `/api/videos/{id}` (20 distinct ids per 10 minutes)
/// and one on `/items?id=` (20 distinct `id` values), the client IP taken
/// from `X-Forwarded-For` so each walk below is its own identity.
fn spelled_breadth_config(upstream: SocketAddr, store: &str) -> String {
    format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "videos"
path = "/api/videos/{{id}}"
limits = [{{ limit = 100000, window = "60s" }}]
breadth = {{ distinct = 20, window = "10m", of = "param:id" }}

[[rules]]
name = "items"
path = "/items"
limits = [{{ limit = 100000, window = "60s" }}]
breadth = {{ distinct = 20, window = "10m", of = "query:id" }}
"#,
        head = config_head(upstream, "", store),
    )
}

/// A spelling class: its name and how it spells an id.
type Spelling = (&'static str, Box<dyn Fn(u32) -> String>);

/// Walks ids 1..=`last` spelled by `spell`, as the client `ip`: the ids admitted.
fn walk(gate: &Slidegate, ip: &str, last: u32, spell: impl Fn(u32) -> String) -> Vec<u32> {
    let mut admitted = Vec::new();
    for id in 1..=last {
        let target = spell(id);
        let reply = gate.get(&target, &[("x-forwarded-for", ip)]);
        match reply.status {
            200 => admitted.push(id),
            429 => assert!(reply.header("ratelimit-policy").is_some_and(|p| p.contains("-breadth"))),
            other => panic!("{target}: status {other}: {reply:?}"),
        }
    }
    admitted
}

/// Every spelling class of the path table reads the id a router would
/// serve, or counts as a value of its own: none steps aside. A WSGI
/// upstream serves `/api/videos%2F7` as video 7 (it decodes `%2F`), Tomcat
/// and Spring serve `/api/videos/x/..;/7` as video 7; both once passed 60
/// of 60 distinct ids against a breadth of 20.
#[test]
fn no_spelling_of_an_id_escapes_crawl_breadth() {
    clear_of_a_window_end(std::time::Duration::from_secs(60));
    let upstream = Upstream::start();
    let gate = Slidegate::start(&spelled_breadth_config(upstream.addr, ""));
    let first_20: Vec<u32> = (1..=20).collect();
    type Class = (&'static str, fn(u32) -> String);
    let classes: [Class; 9] = [
        ("plain", |n| format!("/api/videos/{n}")),
        ("encoded slash (WSGI)", |n| format!("/api/videos%2F{n}")),
        ("encoded slashes (WSGI)", |n| format!("/api%2Fvideos%2F{n}")),
        ("dot-dot path parameter (Tomcat, Spring)", |n| format!("/api/videos/x/..;/{n}")),
        ("path parameter (Tomcat, Spring)", |n| format!("/api/videos/{n};jsessionid=1")),
        ("backslash (IIS)", |n| format!("/api%5Cvideos%5C{n}")),
        ("case (Express, IIS)", |n| format!("/API/Videos/{n}")),
        ("trailing tab (Spring)", |n| format!("/api/videos/{n}%09")),
        ("encoded dot segment", |n| format!("/api/x/%2e%2e/videos/{n}")),
    ];
    for (i, (class, spell)) in classes.iter().enumerate() {
        let ip = format!("10.0.1.{}", i + 1);
        assert_eq!(walk(&gate, &ip, 60, spell), first_20, "{class}: a walk of 60 ids");
    }
    // The reading that matched is the reading counted: after a plain walk of
    // ids 1..=20, the WSGI and Tomcat spellings of those ids are revisits,
    // and of id 21 a new value past the limit.
    for (class, spell) in &classes[1..4] {
        assert_eq!(walk(&gate, "10.0.1.1", 21, spell), first_20, "{class}: revisits of ids seen");
    }
}

/// `of = "query:id"` counts the `id` values of the query as a router reads
/// them: decoded, whatever the name's case or encoding, every value of a
/// repeated `id` (PHP and Django take the last, Flask the first), and
/// requests without one as one value. Before, ids in the query could not be
/// counted at all.
#[test]
fn ids_in_the_query_are_counted_on_redis() {
    clear_of_a_window_end(std::time::Duration::from_secs(60));
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let gate = Slidegate::start(&spelled_breadth_config(upstream.addr, &redis_decides(&redis)));
    let first_20: Vec<u32> = (1..=20).collect();
    let long = "a".repeat(8000);
    let classes: [Spelling; 7] = [
        ("plain", Box::new(|n| format!("/items?id={n}"))),
        ("repeated, the last varying", Box::new(|n| format!("/items?id=1&id={n}"))),
        ("repeated, the first varying", Box::new(|n| format!("/items?id={n}&id=1&x=2"))),
        ("another case (ASP.NET)", Box::new(|n| format!("/items?ID={n}"))),
        ("array form (PHP, Rails, qs)", Box::new(|n| format!("/items?id[]={n}"))),
        ("`;` separated (older Python)", Box::new(|n| format!("/items?x=1;id={n}"))),
        ("8 KB values", Box::new(move |n| format!("/items?id={long}{n}"))),
    ];
    for (i, (class, spell)) in classes.iter().enumerate() {
        let ip = format!("10.0.2.{}", i + 1);
        assert_eq!(walk(&gate, &ip, 60, spell), first_20, "{class}: a walk of 60 ids");
    }
    // Encoded names and values are the same values: revisits.
    let ip = "10.0.2.1";
    let encoded = |n: u32| n.to_string().chars().map(|digit| format!("%3{digit}")).collect::<String>();
    assert_eq!(walk(&gate, ip, 20, |n| format!("/items?i%64={}", encoded(n))).len(), 20);
    assert_eq!(walk(&gate, ip, 20, |n| format!("/items?a=b&id={n}")).len(), 20);
    assert_eq!(walk(&gate, ip, 1, |_| "/items?id=21".to_owned()), Vec::<u32>::new());
    // No id at all, or an empty one, is one value each: the 21st and 22nd
    // distinct values of a fresh client are refused.
    let fresh = "10.0.2.99";
    assert_eq!(walk(&gate, fresh, 20, |n| format!("/items?id={n}")).len(), 20);
    assert_eq!(walk(&gate, fresh, 3, |_| "/items".to_owned()), Vec::<u32>::new());
    assert_eq!(walk(&gate, fresh, 3, |_| "/items?id=".to_owned()), Vec::<u32>::new());
    assert_eq!(walk(&gate, fresh, 3, |_| "/items?id=&id=".to_owned()), Vec::<u32>::new());
}

/// Redis down: breadth no longer steps aside under the default failure
/// policy. The fallback's own sketches admit `distinct / instances` new ids
/// per window (here 20 of 60), not all 60; a rule
/// with `on_error = "allow"` still steps aside, as documented.
#[test]
fn a_store_outage_does_not_lift_crawl_breadth() {
    clear_of_a_window_end(std::time::Duration::from_secs(60));
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let rule = |name: &str, extra: &str| {
        format!(
            "[[rules]]\nname = \"{name}\"\npath = \"/api/{name}/{{id}}\"\nlimits = [{{ limit = 100000, window = \"60s\" }}]\n\
             breadth = {{ distinct = 20, window = \"10m\", of = \"param:id\" }}\n{extra}\n"
        )
    };
    let config = format!(
        "{head}\n[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n\n{videos}{open}",
        head = config_head(
            upstream.addr,
            "",
            &format!("[store]\nurl = \"{}\"\ntimeout_ms = 200\n", redis.url())
        ),
        videos = rule("videos", ""),
        open = rule("open", "on_error = \"allow\""),
    );
    let gate = Slidegate::start(&config);
    // Five ids of each while Redis answers: in its sketch, not the fallback's.
    for id in 0..5 {
        assert_eq!(gate.get(&format!("/api/videos/{id}"), &[]).status, 200);
        assert_eq!(gate.get(&format!("/api/open/{id}"), &[]).status, 200);
    }
    redis.kill();
    let walk = |name: &str| -> usize {
        (100..160).filter(|id| gate.get(&format!("/api/{name}/{id}"), &[]).status == 200).count()
    };
    let admitted = walk("videos");
    // HyperLogLog at 20 values: a new id whose register already holds its
    // rank is taken for one seen now and then, so 20 or a few fewer.
    assert!((17..=20).contains(&admitted), "{admitted} of 60 new ids admitted while Redis was down");
    assert_eq!(walk("open"), 60, "on_error = \"allow\" steps aside");
}
