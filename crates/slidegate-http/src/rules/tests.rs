//! Rule matching against every spelling class of a path.

use super::*;

fn p(s: &str) -> PathPattern {
    s.parse().unwrap()
}

#[test]
fn exact_patterns_match_only_themselves() {
    let exact = p("/api/videos/trending");
    assert!(exact.matches("/api/videos/trending"));
    assert!(!exact.matches("/api/videos/trending/"));
    assert!(!exact.matches("/api/videos/trendingx"));
    assert!(!exact.matches("/api/videos"));
}

#[test]
fn stars_match_any_text_slashes_included() {
    let glob = p("/api/search*");
    for ok in ["/api/search", "/api/search/", "/api/searches", "/api/search/a/b"] {
        assert!(glob.matches(ok), "{ok}");
    }
    assert!(!glob.matches("/api/sear"));
    let middle = p("/static/*.png");
    assert!(middle.matches("/static/a/b.png"));
    assert!(!middle.matches("/static/a/b.jpg"));
    assert!(p("*").matches("/anything"));
    assert!(p("/a/*/c").matches("/a/b/x/c"));
}

#[test]
fn params_match_exactly_one_non_empty_segment() {
    let param = p("/api/videos/{id}/comments");
    assert!(param.matches("/api/videos/42/comments"));
    assert!(!param.matches("/api/videos//comments"));
    assert!(!param.matches("/api/videos/4/2/comments"));
    let tail = p("/users/{id}");
    assert!(tail.matches("/users/7"));
    assert!(!tail.matches("/users/7/"));
    assert!(!tail.matches("/users/"));
}

#[test]
fn malformed_patterns_say_why() {
    assert!("api".parse::<PathPattern>().unwrap_err().to_string().contains("must start with '/'"));
    assert!("/a{id}".parse::<PathPattern>().unwrap_err().to_string().contains("whole path segment"));
    assert!("/{id".parse::<PathPattern>().unwrap_err().to_string().contains("closed by '}'"));
    assert!("/{id}x".parse::<PathPattern>().unwrap_err().to_string().contains("whole path segment"));
    assert!("/{}".parse::<PathPattern>().unwrap_err().to_string().contains("needs a name"));
    assert!("/a?b=1".parse::<PathPattern>().unwrap_err().to_string().contains("without query"));
    assert!("/users/".parse::<PathPattern>().unwrap_err().to_string().contains("never matches"));
    assert!("/".parse::<PathPattern>().is_ok());
}

#[test]
fn the_first_matching_rule_wins_and_methods_filter() {
    let m = RuleMatcher::new(vec![
        (vec![Method::GET], p("/api/videos/trending")),
        (vec![], p("/api/search*")),
        (vec![Method::POST], p("/api/*")),
    ]);
    assert_eq!(m.find(&Method::GET, "/api/videos/trending"), Some(0));
    assert_eq!(m.find(&Method::HEAD, "/api/videos/trending"), Some(0));
    assert_eq!(m.find(&Method::PUT, "/api/videos/trending"), None);
    assert_eq!(m.find(&Method::DELETE, "/api/search/x"), Some(1));
    assert_eq!(m.find(&Method::POST, "/api/videos/trending"), Some(2));
    assert_eq!(m.find(&Method::GET, "/health"), None);
}

/// Django and Flask upper-case the method before routing, so `get` is
/// served as `GET`: a rule on `GET` must count it.
#[test]
fn methods_match_in_any_case() {
    let m =
        RuleMatcher::new(vec![(vec![Method::GET], p("/api/videos/trending")), (vec![Method::POST], p("*"))]);
    let method = |s: &str| Method::from_bytes(s.as_bytes()).unwrap();
    for spelled in ["get", "Get", "gET", "GET", "head", "Head", "HEAD"] {
        assert_eq!(m.find(&method(spelled), "/api/videos/trending"), Some(0), "{spelled}");
    }
    for spelled in ["post", "Post"] {
        assert_eq!(m.find(&method(spelled), "/api/videos/trending"), Some(1), "{spelled}");
    }
    for other in ["put", "gett", "ge", "options", "PATCH"] {
        assert_eq!(m.find(&method(other), "/api/videos/trending"), None, "{other}");
    }
    // An extension method in the rule compares without case as well.
    let m = RuleMatcher::new(vec![(vec![method("PURGE")], p("*"))]);
    assert_eq!(m.find(&method("purge"), "/x"), Some(0));
}

#[test]
fn format_suffixes_match_only_where_the_rule_asks() {
    let plain = RuleMatcher::new(vec![(vec![], p("/api/feed"))]);
    assert_eq!(plain.find(&Method::GET, "/api/feed.json"), None);
    let m = RuleMatcher::new(vec![
        (vec![], p("/api/feed").format_suffix(true)),
        (vec![], p("/api/v1.0/{id}/items").format_suffix(true)),
    ]);
    for spelling in [
        "/api/feed",
        "/api/feed.json",
        "/api/feed.xml",
        "/API/Feed.JSON",
        "/api/feed.tar.gz",
        "/api/feed.",
        "/api/feed..json",
        "/api/feed.json/",
        "/api/feed.json;jsessionid=1",
        "/api/feed.json%09",
        "/api/feed%2Ejson",
        "/api%2Ffeed.json",
        "/api/x/../feed.json",
    ] {
        assert_eq!(m.find(&Method::GET, spelling), Some(0), "{spelling}");
    }
    for other in ["/api/feedx.json", "/api/feed/x.json", "/api/.json", "/api/feed.json/x", "/api/fee.json"] {
        assert_eq!(m.find(&Method::GET, other), None, "{other}");
    }
    // A dot in the pattern's own text: the suffix is cut at the last dot.
    assert_eq!(m.find(&Method::GET, "/api/v1.0/7/items.json"), Some(1));
    assert_eq!(m.find(&Method::GET, "/api/v1.0/7/items"), Some(1));
    assert!(p("/api/feed").format_suffix(true).is_format_suffix());
    // Thousands of dots cost two more readings, not one per dot.
    let dots = format!("/api/feed{}", ".a".repeat(20_000));
    assert_eq!(m.find(&Method::GET, &dots), Some(0));
}

/// The reading a rule matched is the one handed on (breadth reads its
/// value there): the normalised path when it matches, else the lenient.
#[test]
fn the_matching_reading_is_the_one_that_matched() {
    let m = RuleMatcher::new(vec![(vec![], p("/api/videos/{id}"))]);
    let path = |s: &str| m.matching(&Method::GET, s).map(|r| r.path.into_owned());
    assert_eq!(path("/api/videos/7").as_deref(), Some("/api/videos/7"));
    assert_eq!(path("/api//videos/%37/").as_deref(), Some("/api/videos/7"));
    assert_eq!(path("/api/videos%2F7").as_deref(), Some("/api/videos/7"));
    assert_eq!(path("/api/videos/x/..;/7").as_deref(), Some("/api/videos/7"));
    assert_eq!(path("/api/videos/7;x").as_deref(), Some("/api/videos/7;x"));
    assert_eq!(path("/api/videos"), None);
}

#[test]
fn path_variants_fall_under_the_same_rule() {
    let m =
        RuleMatcher::new(vec![(vec![Method::GET], p("/api/videos/trending")), (vec![], p("/users/{id}"))]);
    for variant in [
        "/api/videos/trending",
        "/api/videos/trending/",
        "//api/videos/trending",
        "/api//videos///trending//",
        "/api/videos/%74rending",
        "/%61pi/videos/TRENDING/../%74%72%65%6E%64%69%6e%67",
        "/api/./videos/trending",
        "/api/videos/./trending/.",
        "/api/x/../videos/trending",
        "/../../api/videos/trending",
        "/api/videos/%2e/trending",
    ] {
        assert_eq!(m.find(&Method::GET, variant), Some(0), "{variant}");
    }
    assert_eq!(m.find(&Method::GET, "/users/7/"), Some(1));
    // WSGI decodes %2F into a separator, so the lenient reading matches.
    assert_eq!(m.find(&Method::GET, "/api/videos%2Ftrending"), Some(0));
    assert_eq!(m.find(&Method::GET, "/api/videos/trending/x/.."), Some(0));
    assert_eq!(m.find(&Method::GET, "/api/videos/trending/x"), None);
}

/// Every spelling a common router serves from the handler of
/// `/api/videos/trending` falls under a rule on it, whatever the rule's
/// kind: slidegate must never match less than the upstream's router.
#[test]
fn router_spellings_fall_under_every_kind_of_rule() {
    let kinds = [
        ("exact", p("/api/videos/trending")),
        ("star", p("/api/*/trending")),
        ("param", p("/api/{section}/trending")),
    ];
    let classes: &[(&str, &[&str])] = &[
        (
            "case (Express, ASP.NET, IIS)",
            &["/API/Videos/TRENDING", "/api/videos/Trending", "/%41PI/videos/trending"],
        ),
        (
            "encoded slash (WSGI PATH_INFO)",
            &["/api%2Fvideos%2ftrending", "/api/videos%2Ftrending", "/api%2F%2Fvideos/trending"],
        ),
        (
            "backslash (IIS)",
            &["/api\\videos\\trending", "/api%5Cvideos%5ctrending", "/api\\videos/trending\\"],
        ),
        (
            "path parameters (Tomcat, Spring)",
            &[
                "/api/videos/trending;jsessionid=1",
                "/api;a/videos;b=2/trending;c",
                "/api/videos/x/..;/trending",
                "/api/videos/x/..;a=b/trending",
            ],
        ),
        (
            "trailing dots and spaces (IIS)",
            &[
                "/api/videos/trending.",
                "/api/videos./trending...",
                "/api/videos/trending%20",
                "/api/videos%20./trending%20%20",
            ],
        ),
        (
            "leading and trailing whitespace (Spring trims path tokens)",
            &[
                "/api/videos/trending%09",
                "/api/videos/trending%0D%0A",
                "/api/videos/trending%0a",
                "/api/videos/%20trending",
                "/api%09/videos/trending%20%09",
                "/api/videos/trending%09.%20",
            ],
        ),
        (
            "encoded dot segments",
            &[
                "/api/x/%2e%2e/videos/trending",
                "/api/x/.%2E/videos/trending",
                "/api/videos/%2e/trending",
                "/api/x/%2e%2e%2fvideos/trending",
            ],
        ),
        (
            "NUL (a C-string router stops there)",
            &["/api/videos/trending%00.json", "/api/videos/trending%00/x"],
        ),
    ];
    for (kind, pattern) in &kinds {
        let m = RuleMatcher::new(vec![(vec![Method::GET], pattern.clone())]);
        for (class, spellings) in classes {
            for spelling in *spellings {
                assert_eq!(
                    m.find(&Method::GET, spelling),
                    Some(0),
                    "{class}: {spelling:?} against {kind} {pattern}"
                );
            }
        }
        // Other resources stay other resources.
        for other in ["/api/videos/trendingx", "/api/videos/trend", "/api/videos/trending/x", "/api/trending"]
        {
            assert_eq!(m.find(&Method::GET, other), None, "{other:?} against {kind} {pattern}");
        }
    }
    // A case-sensitive rule does not fold, but the other classes still apply.
    let m = RuleMatcher::new(vec![(vec![], p("/api/videos/trending").case_sensitive(true))]);
    assert_eq!(m.find(&Method::GET, "/API/videos/trending"), None);
    assert_eq!(m.find(&Method::GET, "/api/videos%2Ftrending;x."), Some(0));
    // Express keeps %2F inside one segment: a {param} still matches it.
    let m = RuleMatcher::new(vec![(vec![], p("/users/{id}"))]);
    assert_eq!(m.find(&Method::GET, "/users/a%2Fb"), Some(0));
    assert_eq!(m.find(&Method::GET, "/users/a;b"), Some(0));
    assert!(refused_path("/api/videos/trending%00").is_some());
    assert!(refused_path("/api/videos/trending%0A").is_none());
}

#[test]
fn lenient_paths_are_canonical() {
    for (path, expected) in [
        ("/", "/"),
        ("/a;b", "/a"),
        ("/;x", "/"),
        ("/a%3Bb", "/a%3Bb"),
        ("/a%3bb", "/a%3Bb"),
        ("/a%252F", "/a%252F"),
        ("/%zz", "/%25zz"),
        ("/a%2Fb%5Cc", "/a/b/c"),
        ("/a/.../b", "/a/b"),
        ("/a/b%00c/d", "/a/b"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/a b", "/a%20b"),
        ("/a/%2E%2E", "/"),
        ("/a%09", "/a"),
        ("/a\t\r\n /b ", "/a/b"),
        ("/%20a%20/%0D%0Ab%0A", "/a/b"),
        ("/a%09b", "/a%09b"),
        ("/a/%09%20/b", "/a/b"),
        ("/a/%20../b", "/a/b"),
        ("/a/..%09/b", "/a/b"),
        ("/a/%7F", "/a/%7F"),
        ("*", "*"),
    ] {
        assert_eq!(lenient_path(path), expected, "{path}");
    }
    assert!(matches!(lenient_path("/api/videos"), Cow::Borrowed(_)));
}

#[test]
fn normal_paths_are_borrowed_and_others_rewritten() {
    for normal in ["/", "/api/videos/trending", "/a/b.c/%2F/%20/%zz/%4", "/a/...", "/a%", "*"] {
        assert!(matches!(normalize_path(normal), Cow::Borrowed(_)), "{normal}");
    }
    for (path, expected) in [
        ("//", "/"),
        ("/./", "/"),
        ("/..", "/"),
        ("/a/", "/a"),
        ("/a//b", "/a/b"),
        ("/a/./b/../c", "/a/c"),
        ("/%7Euser/%41%2f%25", "/~user/A%2f%25"),
        ("/a/%2E%2E/b", "/b"),
        // A bare `%` that decoding puts before two hex digits: normalising
        // again would decode those (`/%4A` into `/J`), so it is escaped.
        ("/%4%41", "/%254A"),
        ("/%%341", "/%2541"),
        ("/%%41F/%4", "/%25AF/%4"),
    ] {
        let normalised = normalize_path(path);
        assert!(matches!(normalised, Cow::Owned(_)), "{path}");
        assert_eq!(normalised, expected, "{path}");
        assert_eq!(normalize_path(expected), expected, "{expected} is not normal");
    }
}

#[test]
fn adversarial_globs_are_decided_without_exponential_backtracking() {
    // Exponential in the number of stars for a backtracking matcher
    // (35 s for 400 bytes); linear here.
    let glob = p("/*a*a*a*a*a*a*a*a*b");
    let long = format!("/{}", "a".repeat(4000));
    assert!(!glob.matches(&long));
    assert!(glob.matches(&format!("{long}b")));
    let segments = p("/*/{id}/*a*a*a*a*c/{x}");
    let path = format!("/{}/7/{}c/9", "a/".repeat(500), "a".repeat(2000));
    assert!(segments.matches(&path));
    assert!(!segments.matches(&format!("{path}/")));
}

#[test]
fn stars_and_params_combine() {
    assert!(p("*/{id}").matches("/a/b/7"));
    assert!(!p("*/{id}").matches("/a/b/"));
    assert!(p("/a/*/{id}/x").matches("/a/b/c/7/x"));
    assert!(!p("/a/*/{id}/x").matches("/a/7/x"));
    assert!(p("/a*b").matches("/ab") && p("/a*b").matches("/axbyb") && !p("/a*b").matches("/abx"));
    assert!(p("/é*").matches("/éa") && p("*é").matches("/aé") && !p("*é").matches("/ae"));
    assert!(p("/*").matches("/") && !p("/*x").matches("/"));
}

#[test]
fn grpc_paths_match_with_their_dots_and_stars() {
    // gRPC calls `/package.Service/Method`: dots are text, never segments
    // to resolve or suffixes to cut, in both readings of the path.
    for path in ["/shop.Cart/Add", "/grpc.health.v1.Health/Check", "/a.b.c.D/Watch"] {
        assert!(matches!(normalize_path(path), Cow::Borrowed(_)), "{path}");
        assert_eq!(lenient_path(path), path);
    }
    assert!(p("/shop.Cart/Add").matches("/shop.Cart/Add"));
    assert!(!p("/shop.Cart/Add").matches("/shop.Cart/AddMany"));
    assert!(!p("/shop.Cart/Add").matches("/shopXCart/Add"));
    // A whole service, every method of every service of a package, one method anywhere.
    assert!(p("/shop.Cart/*").matches("/shop.Cart/Watch"));
    assert!(!p("/shop.Cart/*").matches("/shop.Carts/Watch"));
    assert!(p("/shop.*").matches("/shop.Cart/Add") && p("/shop.*").matches("/shop.v2.Orders/Get"));
    assert!(!p("/shop.*").matches("/shopping.Cart/Add"));
    assert!(p("*/Check").matches("/grpc.health.v1.Health/Check"));
    // `{param}` fills the method segment.
    assert!(p("/shop.Cart/{method}").matches("/shop.Cart/Add"));
    // A format suffix never cuts into a service name: only the last segment has one.
    assert!(!p("/shop").format_suffix(true).matches("/shop.Cart/Add"));
}
