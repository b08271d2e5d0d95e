//! `[store] snapshot`, `snapshot_interval` and `snapshot_corrupt`: the
//! embedded store's file across restarts ([`SnapshotConfig`]).

use std::fs::OpenOptions;
use std::path::Path;
use std::time::Duration;

use super::super::error::ConfigError;
use super::super::raw::RawStore;
use super::super::types::{OnCorruptSnapshot, SnapshotConfig};
use super::Validator;

/// The shortest interval: writing a million identities takes a fraction of
/// a second (BENCHMARKS.md), so more often would keep a core busy.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest: a crash would lose a day.
const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

impl Validator<'_> {
    /// The snapshot keys: for the embedded store only, the interval and the
    /// corrupt-file choice only beside a file, and the file's directory one
    /// this process can write in.
    pub(super) fn snapshot(
        &self,
        raw: &mut RawStore,
        redis: bool,
    ) -> Result<Option<SnapshotConfig>, ConfigError> {
        let (interval, corrupt) = (raw.snapshot_interval.take(), raw.snapshot_corrupt.take());
        let Some(file) = raw.snapshot.take() else {
            if let Some(interval) = interval {
                return Err(
                    self.err(interval.span, "snapshot_interval needs `snapshot = \"<file>\"` in [store]")
                );
            }
            if let Some(corrupt) = corrupt {
                return Err(
                    self.err(corrupt.span(), "snapshot_corrupt needs `snapshot = \"<file>\"` in [store]")
                );
            }
            return Ok(None);
        };
        if redis {
            return Err(self.err(
                file.span(),
                "snapshot keeps the embedded store's counters across restarts; Redis keeps its own: \
                 expected no snapshot beside `url`, `cluster` or `sentinel`",
            ));
        }
        let text = file.get_ref();
        if text.is_empty() || text.contains('\0') || text.ends_with('/') {
            return Err(self.err(
                file.span(),
                format!("snapshot {text:?} is not a file name: expected a path such as \"/var/lib/slidegate/state.snap\""),
            ));
        }
        let path = self.beside(text);
        if let Err(why) = writable_beside(&path) {
            return Err(self.err(file.span(), format!("snapshot {}: {why}", path.display())));
        }
        let interval = match interval {
            None => SnapshotConfig::DEFAULT_INTERVAL,
            Some(i) if (MIN_INTERVAL..=MAX_INTERVAL).contains(&i.duration) => i.duration,
            Some(i) => {
                return Err(self.err(
                    i.span,
                    format!(
                        "snapshot_interval {:?} is out of range: expected 1s to 24h, such as \"30s\"",
                        i.text
                    ),
                ))
            }
        };
        let on_corrupt = match corrupt.as_ref().map(|c| c.get_ref().as_str()) {
            None | Some("start-empty") => OnCorruptSnapshot::StartEmpty,
            Some("refuse") => OnCorruptSnapshot::Refuse,
            Some(other) => {
                let span = corrupt.as_ref().map(|c| c.span()).unwrap_or_default();
                return Err(self.err(
                    span,
                    format!(
                        "unknown snapshot_corrupt {other:?}: expected \"start-empty\" (log it, keep the file \
                         aside and start with empty counters, the default) or \"refuse\" (exit with the error)"
                    ),
                ));
            }
        };
        Ok(Some(SnapshotConfig { path, interval, on_corrupt }))
    }
}

/// Whether a snapshot can be written at `path`: not a directory, and its
/// directory one a file can be created in (tried, and removed at once).
fn writable_beside(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("is a directory: expected a file name in it".into());
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("its directory {} does not exist", dir.display()));
    }
    let probe = dir.join(format!(".slidegate-snapshot-probe.{}", std::process::id()));
    match OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot write in its directory {}: {e}", dir.display())),
    }
}
