//! Packaging conventions a distributor checks before shipping the binary:
//! license files matching the manifest, no placeholder repository, an
//! install line in the README, and a systemd unit wired to reload on
//! `SIGHUP`, stop in time on `SIGTERM` and run sandboxed.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value of `key = "..."` under `[workspace.package]`.
fn workspace_field(key: &str) -> Option<String> {
    let manifest = read("Cargo.toml");
    let package =
        manifest.split("[workspace.package]").nth(1).unwrap().split("\n[").next().unwrap().to_owned();
    package.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

#[test]
fn license_files_match_the_manifest_and_no_placeholder_repository() {
    assert_eq!(workspace_field("license").as_deref(), Some("MIT OR Apache-2.0"));
    let mit = read("LICENSE-MIT");
    assert!(mit.starts_with("MIT License\n\nCopyright (c) "), "{mit}");
    assert!(mit.contains("Permission is hereby granted, free of charge, to any person obtaining a copy"));
    assert!(mit.contains("THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND"));
    let apache = read("LICENSE-APACHE");
    assert!(apache.contains("Apache License\n                           Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
    // A repository field is real or absent: never a placeholder.
    if let Some(repository) = workspace_field("repository") {
        assert!(!repository.contains("example") && !repository.contains(".invalid"), "{repository}");
    }
    let readme = read("README.md");
    assert!(readme.contains("cargo install --path crates/slidegate-cli"));
    assert!(readme.contains("LICENSE-MIT") && readme.contains("LICENSE-APACHE"));
}

#[test]
fn the_systemd_unit_reloads_on_sighup_and_stops_within_its_timeout() {
    let unit = read("docs/slidegate.service");
    let value = |key: &str| -> &str {
        let prefix = format!("{key}=");
        unit.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {key}="))
    };
    // The file is checked first, so a broken one fails `systemctl reload`
    // visibly; then SIGHUP.
    let reloads: Vec<&str> = unit.lines().filter_map(|l| l.strip_prefix("ExecReload=")).collect();
    assert_eq!(
        reloads,
        ["/usr/bin/slidegate check-config --config /etc/slidegate/slidegate.toml", "/bin/kill -HUP $MAINPID"]
    );
    assert_eq!(value("KillSignal"), "SIGTERM");
    assert!(value("ExecStart").ends_with("serve --config /etc/slidegate/slidegate.toml"));
    // Above drain_delay + shutdown_grace of the shutdown example in
    // docs/serve.md (5 s + 20 s), the defaults' 0 s + 10 s too.
    let stop: u64 = value("TimeoutStopSec").trim_end_matches('s').parse().unwrap();
    assert!(stop > 25, "TimeoutStopSec={stop}");
    // As the Debian package's user (its postinst adds it), sandboxed.
    for line in ["User=slidegate", "ProtectSystem=strict", "NoNewPrivileges=yes", "PrivateTmp=yes"] {
        assert!(unit.lines().any(|l| l == line), "no {line}");
    }
    assert!(unit.contains("/readyz"));
    assert!(read("docs/serve.md").contains("docs/slidegate.service"));
}
