//! Writing a file so that a crash leaves the old one or the new one whole:
//! a temporary file beside it, synced, renamed over it, the directory synced.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` through `write`, atomically (see the module doc). The
/// temporary file is removed when anything fails.
pub(super) fn write_atomically<T>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<&File>) -> io::Result<T>,
) -> io::Result<T> {
    let temporary = temporary_beside(path)?;
    let written = write_synced(&temporary, write).and_then(|written| {
        fs::rename(&temporary, path)?;
        sync_directory(path)?;
        Ok(written)
    });
    if written.is_err() {
        // Nothing to keep of a write that failed; the old file is untouched.
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// A name in `path`'s directory no other writer in this process or another uses.
fn temporary_beside(path: &Path) -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the path names a directory, not a file")
    })?;
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(".{}.{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    Ok(path.with_file_name(temporary))
}

fn write_synced<T>(
    temporary: &Path,
    write: impl FnOnce(&mut BufWriter<&File>) -> io::Result<T>,
) -> io::Result<T> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        // Identity hashes and penalties: for the service's user only.
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let file = options.open(temporary)?;
    let mut out = BufWriter::with_capacity(1 << 20, &file);
    let written = write(&mut out)?;
    out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    Ok(written)
}

/// Makes the rename durable: on Linux a rename is on disk once its
/// directory is synced.
fn sync_directory(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
