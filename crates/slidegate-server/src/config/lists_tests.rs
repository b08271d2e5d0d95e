//! `[lists]` and the rules' `allow` / `deny`: parsing, key files, located errors.

use std::path::{Path, PathBuf};

use ipnet::IpNet;

use super::*;

const SECRET: &str = "a-secret-long-enough-for-anyone-1";

/// A directory holding `files`, and the path a config file in it would have.
fn dir_with(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let config = dir.path().join("slidegate.toml");
    (dir, config)
}

fn load(source: &str, path: &Path, secret: bool) -> Result<Config, ConfigError> {
    let env = |name: &str| (secret && name == "S").then(|| SECRET.to_owned());
    Config::parse_with_env(source, path, &env)
}

/// `(file name, line, column, message)` of an error.
fn located(e: ConfigError) -> (String, usize, usize, String) {
    let ConfigError::Invalid { path, line, column, message, .. } = e else { panic!("{e}") };
    (path.file_name().unwrap().to_string_lossy().into_owned(), line, column, message)
}

const HEAD: &str = "[identity]\napi_key_header = \"x-api-key\"\nip_hash_secret_env = \"S\"\n";

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn global_and_rule_lists_read_networks_and_key_files_beside_the_config() {
    let partner_hash = slidegate_http::KeyHasher::keyed(SECRET.as_bytes()).hash(b"partner-by-hash");
    let partners = format!("# partners\npartner-1\n\n  partner-2  \r\n{partner_hash:016x}\n");
    let (_dir, path) = dir_with(&[("partners.txt", partners.as_bytes()), ("abusers.txt", b"abuser\n")]);
    let source = format!(
        "{HEAD}[lists]\nallow = {{ cidrs = [\"10.0.0.0/8\", \"2001:db8::/32\", \"::ffff:192.0.2.0/120\", \"198.51.100.7\"], keys_file = \"partners.txt\" }}\n\
         deny = {{ keys_file = \"abusers.txt\" }}\n\
         [[rules]]\nname = \"api\"\npath = \"/api/*\"\nlimits = [{{ limit = 5, window = \"1m\" }}]\n\
         deny = {{ cidrs = [\"203.0.113.0/24\"] }}\n"
    );
    let config = load(&source, &path, true).unwrap();
    let lists = &config.limiter.lists;
    assert_eq!(lists.allow.cidrs, nets(&["10.0.0.0/8", "2001:db8::/32", "192.0.2.0/24", "198.51.100.7/32"]));
    for key in ["partner-1", "partner-2", "partner-by-hash"] {
        assert!(lists.allow.keys.contains_key(key.as_bytes()), "{key}");
    }
    assert!(!lists.allow.keys.contains_key(b"# partners"));
    // 16 hex digits also list the key that reads so.
    assert!(lists.allow.keys.contains_key(format!("{partner_hash:016x}").as_bytes()));
    assert!(lists.deny.keys.contains_key(b"abuser") && lists.deny.cidrs.is_empty());
    let rule = &config.limiter.rules[0].lists;
    assert_eq!(rule.deny.cidrs, nets(&["203.0.113.0/24"]));
    assert!(rule.allow.is_empty());
    // The debug form a reload compares shows no key.
    let shown = format!("{config:?}");
    assert!(!shown.contains("partner-1") && !shown.contains("abuser"), "{shown}");
    // The same file loads to the same lists: a reload sees no change.
    assert_eq!(load(&source, &path, true).unwrap().limiter.lists, *lists);
}

#[test]
fn bad_networks_and_an_address_on_both_lists_are_located_in_the_config() {
    let (_dir, path) = dir_with(&[]);
    let bad = format!("{HEAD}[lists]\nallow = {{ cidrs = [\"10.0.0.0/33\"] }}\n");
    let (file, line, column, message) = located(load(&bad, &path, true).unwrap_err());
    assert_eq!((file.as_str(), line, column), ("slidegate.toml", 5, 20));
    assert!(message.starts_with("invalid CIDR \"10.0.0.0/33\" in allow.cidrs: expected"), "{message}");
    let both = format!(
        "{HEAD}[[rules]]\nname = \"api\"\npath = \"/api/*\"\nlimits = [{{ limit = 5, window = \"1m\" }}]\n\
         allow = {{ cidrs = [\"10.0.0.0/8\"] }}\ndeny = {{ cidrs = [\"10.1.2.3/8\"] }}\n"
    );
    let (_, line, column, message) = located(load(&both, &path, true).unwrap_err());
    assert_eq!((line, column), (9, 19));
    assert_eq!(message, "10.0.0.0/8 is in both allow.cidrs and deny.cidrs: deny would win; list it once");
    let unknown = format!("{HEAD}[lists]\nallow = {{ cidr = [\"10.0.0.0/8\"] }}\n");
    assert!(located(load(&unknown, &path, true).unwrap_err()).3.contains("unknown field `cidr`"));
}

#[test]
fn key_file_errors_name_the_file_and_its_own_line() {
    let cases: [(&[u8], usize, usize, &str); 5] = [
        (b"ok-1\nok-2\n\n  two,keys\n", 4, 3, "a key with a comma"),
        (b"ok\nbad\x01key\n", 2, 1, "a control character"),
        (b"# c\nok\n\xff\n", 3, 1, "invalid UTF-8 (byte 0xff)"),
        (b"abuser\n", 1, 1, "key "),
        (b"0123456789ABCDEF\n", 0, 0, ""),
    ];
    for (bytes, line, column, start) in cases {
        let (_dir, path) = dir_with(&[("keys.txt", bytes), ("allow.txt", b"abuser\n")]);
        let source = format!(
            "{HEAD}[lists]\nallow = {{ keys_file = \"allow.txt\" }}\ndeny = {{ keys_file = \"keys.txt\" }}\n"
        );
        if line == 0 {
            // Upper-case hex is a hash too.
            assert!(load(&source, &path, true).is_ok());
            continue;
        }
        let (file, at_line, at_column, message) = located(load(&source, &path, true).unwrap_err());
        assert_eq!((file.as_str(), at_line, at_column), ("keys.txt", line, column), "{message}");
        assert!(message.starts_with(start), "{message}");
    }
    let long = vec![b'k'; 5000];
    let (_dir, path) = dir_with(&[("keys.txt", &long)]);
    let source = format!("{HEAD}[lists]\ndeny = {{ keys_file = \"keys.txt\" }}\n");
    assert!(located(load(&source, &path, true).unwrap_err()).3.starts_with("a key of 5000 bytes"));
}

#[test]
fn a_key_file_that_cannot_be_used_is_located_at_its_name() {
    let (dir, path) = dir_with(&[("hash.txt", b"0123456789abcdef\n")]);
    std::fs::create_dir(dir.path().join("adir")).unwrap();
    let with = |file: &str, head: &str| format!("{head}[lists]\ndeny = {{ keys_file = \"{file}\" }}\n");
    let (file, line, column, message) = located(load(&with("missing.txt", HEAD), &path, true).unwrap_err());
    assert_eq!((file.as_str(), line, column), ("slidegate.toml", 5, 22));
    assert!(message.starts_with("cannot read keys_file ") && message.contains("missing.txt"), "{message}");
    let message = located(load(&with("adir", HEAD), &path, true).unwrap_err()).3;
    assert!(message.contains("adir"), "{message}");
    #[cfg(unix)]
    {
        // A FIFO would block the load forever.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let message = located(load(&with("fifo", HEAD), &path, true).unwrap_err()).3;
        assert!(message.ends_with("not a regular file"), "{message}");
    }
    // Past 64 MiB (a sparse file: nothing written).
    std::fs::File::create(dir.path().join("huge.txt")).unwrap().set_len((64 << 20) + 1).unwrap();
    let message = located(load(&with("huge.txt", HEAD), &path, true).unwrap_err()).3;
    assert!(message.ends_with("larger than 64 MiB"), "{message}");
    // A hash without the secret could match nothing.
    let no_secret = "[identity]\napi_key_header = \"x-api-key\"\n";
    let (file, line, _, message) = located(load(&with("hash.txt", no_secret), &path, false).unwrap_err());
    assert_eq!((file.as_str(), line), ("hash.txt", 1));
    assert!(message.contains("needs [identity] ip_hash_secret_env"), "{message}");
    // Keys without an API key header could match nothing either.
    let message = located(load(&with("hash.txt", ""), &path, false).unwrap_err()).3;
    assert!(message.starts_with("deny.keys_file lists API keys, but [identity] sets no api_key_header"));
}
