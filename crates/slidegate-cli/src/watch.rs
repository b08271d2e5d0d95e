//! `[server] watch_config = true`: `serve` re-reads its configuration file
//! when it changes, through the same [`Reloader`] as `SIGHUP`.
//!
//! A thread polls the file's metadata about once a second — modification
//! time, length, device and inode, through any symlinks — so it follows an
//! edit in place, an editor's write-and-rename, and the symlink swap by which
//! Kubernetes updates a mounted ConfigMap (`..data` pointed at a new
//! directory: the path's target, and so its inode, changes). A change is
//! applied once the file has stayed the same for [`SETTLE`], so a file
//! caught half-written is not read. A file that fails validation changes
//! nothing and its located errors are logged, as on `SIGHUP`; a file gone
//! is logged once, and the next file that appears is read.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use slidegate_server::Reloader;

/// How often the file is looked at.
const POLL: Duration = Duration::from_secs(1);

/// How long a changed file must stay unchanged before it is read.
const SETTLE: Duration = Duration::from_millis(300);

/// What is compared between two looks at the file: `None` when it cannot
/// be read (gone, or a dangling symlink mid-swap).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint(Option<(Option<SystemTime>, u64, u64, u64)>);

impl Fingerprint {
    fn of(path: &Path) -> Self {
        // `metadata` follows symlinks: a swapped link shows the new target.
        Fingerprint(std::fs::metadata(path).ok().map(|m| {
            #[cfg(unix)]
            let (dev, ino) = {
                use std::os::unix::fs::MetadataExt as _;
                (m.dev(), m.ino())
            };
            #[cfg(not(unix))]
            let (dev, ino) = (0, 0);
            (m.modified().ok(), m.len(), dev, ino)
        }))
    }
}

/// Starts the watching thread; it runs until the process ends.
///
/// # Errors
/// The thread could not be started.
pub fn spawn(path: PathBuf, reloader: Reloader) -> std::io::Result<()> {
    let mut seen = Fingerprint::of(&path);
    std::thread::Builder::new().name("slidegate-watch".to_owned()).spawn(move || loop {
        std::thread::sleep(POLL);
        let now = Fingerprint::of(&path);
        if now == seen {
            continue;
        }
        let settled = settle(&path, now);
        if settled == seen {
            continue;
        }
        seen = settled;
        if seen.0.is_none() {
            tracing::warn!(path = %path.display(), "watched configuration file is gone: the running configuration stays");
            continue;
        }
        tracing::info!(path = %path.display(), "configuration file changed: reloading");
        // Logged and counted by the reloader, whatever the outcome.
        let _ = reloader.reload();
    })?;
    Ok(())
}

/// Waits until the file looks the same twice [`SETTLE`] apart (at most ten
/// times: a file rewritten without pause is read as it is then).
fn settle(path: &Path, mut last: Fingerprint) -> Fingerprint {
    for _ in 0..10 {
        std::thread::sleep(SETTLE);
        let now = Fingerprint::of(path);
        if now == last {
            break;
        }
        last = now;
    }
    last
}
