//! Rule matching and path normalisation on arbitrary input: they never panic,
//! normalising is idempotent, and a pattern matches a path exactly when it
//! matches the path's normal form (so path variants cannot dodge a rule).

use proptest::prelude::*;
use slidegate_http::{lenient_path, normalize_path, PathPattern, RuleMatcher};

fn path() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("/".to_owned()),
            Just("//".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("%".to_owned()),
            Just("%2".to_owned()),
            Just("%41".to_owned()),
            Just("%2F".to_owned()),
            Just("%7e".to_owned()),
            Just("api".to_owned()),
            Just("a".to_owned()),
            Just("é".to_owned()),
            // The spellings routers disagree on.
            Just(";".to_owned()),
            Just(";x=1".to_owned()),
            Just("..;".to_owned()),
            Just("\\".to_owned()),
            Just("%5C".to_owned()),
            Just("%5c".to_owned()),
            Just("%2f".to_owned()),
            Just("%2e".to_owned()),
            Just("%2E%2e".to_owned()),
            Just("%00".to_owned()),
            Just("%20".to_owned()),
            Just(" ".to_owned()),
            Just("%09".to_owned()),
            Just("%0d%0A".to_owned()),
            Just(".json".to_owned()),
            Just("%3B".to_owned()),
            Just("%25".to_owned()),
            Just("%C3%A9".to_owned()),
            Just("API".to_owned()),
            "[a-z0-9._~-]{1,3}",
        ],
        0..12,
    )
    .prop_map(|parts| format!("/{}", parts.concat()))
}

fn pattern() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![Just("/".to_owned()), Just("*".to_owned()), Just("{id}".to_owned()), "[a-z.]{1,3}"],
        0..6,
    )
    .prop_map(|parts| format!("/{}", parts.concat()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn normalising_is_total_and_idempotent(p in path()) {
        let once = normalize_path(&p).into_owned();
        prop_assert!(once.starts_with('/'), "{p:?} -> {once:?}");
        let twice = normalize_path(&once).into_owned();
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn lenient_reading_is_total_canonical_and_idempotent(p in path()) {
        let once = lenient_path(&p).into_owned();
        prop_assert!(once.starts_with('/'), "{p:?} -> {once:?}");
        prop_assert!(once.is_ascii() && !once.contains(['\\', ';', ' ']), "{p:?} -> {once:?}");
        let twice = lenient_path(&once).into_owned();
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn matching_never_panics(
        pat in pattern(),
        p in path(),
        case_sensitive in any::<bool>(),
        format_suffix in any::<bool>(),
    ) {
        if let Ok(pattern) = pat.parse::<PathPattern>() {
            let pattern = pattern.case_sensitive(case_sensitive).format_suffix(format_suffix);
            let normal = normalize_path(&p);
            let _ = pattern.matches(&p);
            let _ = pattern.matches(&normal);
            let _ = pattern.matches(&lenient_path(&p));
            let _ = RuleMatcher::new(vec![(vec![], pattern)]).find(&http::Method::GET, &p);
        }
    }

    /// Whatever the decoration, a rule on a path matches each of its
    /// spellings: never less than the normal form.
    #[test]
    fn a_rule_matches_every_reading_it_matches(pat in pattern(), p in path()) {
        if let Ok(pattern) = pat.parse::<PathPattern>() {
            let found = RuleMatcher::new(vec![(vec![], pattern.clone())]).find(&http::Method::GET, &p).is_some();
            let either = pattern.matches(&normalize_path(&p)) || pattern.matches(&lenient_path(&p));
            prop_assert_eq!(found, either, "{} on {:?}", pat, p);
        }
    }

    #[test]
    fn decorated_paths_normalise_to_the_plain_one(
        segments in proptest::collection::vec("[a-z0-9_~-]{1,4}", 1..6),
        decorations in proptest::collection::vec(0..4u8, 6),
        trailing in any::<bool>(),
    ) {
        let plain = format!("/{}", segments.join("/"));
        let mut decorated = String::new();
        for (segment, decoration) in segments.iter().zip(&decorations) {
            decorated.push_str(match decoration {
                0 => "/",
                1 => "//",
                2 => "/./",
                _ => "/x/../",
            });
            // Percent-encode the first character: always unreserved here.
            let mut chars = segment.chars();
            let first = chars.next().expect("segments are non-empty");
            decorated.push_str(&format!("%{:02X}", first as u32));
            decorated.push_str(chars.as_str());
        }
        if trailing {
            decorated.push('/');
        }
        let normal = normalize_path(&decorated).into_owned();
        prop_assert_eq!(normal, plain, "{}", decorated);
    }
}
