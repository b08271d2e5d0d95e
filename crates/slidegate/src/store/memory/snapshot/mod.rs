//! Snapshots of the embedded store: its counters and penalty box in a file,
//! so that a restart or an upgrade forgets nothing it would have refused.
//!
//! What a snapshot holds: every state of every limit (the algorithms'
//! states as they decide on them), every penalty state, and the seed of the
//! store's identity hasher (a restored store finds each identity where the
//! snapshot's store put it: the identity itself must hash the same, so the
//! identity hasher's secret must be the same too).
//!
//! Why restoring is exact: every state keeps wall-clock times (ms since the
//! epoch: window numbers, the token bucket's last refill, GCRA's TAT, the
//! log's admission times, a block's end), never an `Instant`. A state read
//! back is decided at the clock's time like any other, so it is aged by the
//! downtime exactly; a clock that reads earlier after the restart than
//! before finds states written "ahead" of it, which the algorithms decide
//! as at the start of their own window (as for a step back in a running
//! process), and a block then ends later, never sooner. States that are
//! idle at the restore (their windows over) are dropped.
//!
//! Writing never stalls decisions for long: the store is written shard by
//! shard, each shard's records encoded into a buffer under that shard's
//! lock (about 1/64 of the store) and written to the file after it is
//! released. The snapshot is so not one instant of the whole store: a
//! decision made while it is written is in it or not, as if made just
//! after. Decisions that keep deciding while a file is written are the
//! next snapshot's.
//!
//! The file (`format.rs`) begins with a magic and a version and ends with
//! a BLAKE3 checksum of everything before it, so a file cut short or
//! altered is refused as a whole ([`Corruption`]), never read in part.
//! [`MemoryStore::save_snapshot`] writes a temporary file in the same
//! directory, syncs it, and renames it over the old one: a crash leaves
//! the old snapshot or the new one, never a mix.
//!
//! Distinct-value sketches (`breadth`) and the shared tables are not kept:
//! a sketch counts one window, and is rebuilt within it.

mod file;
mod format;
mod states;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use thiserror::Error;

use self::format::{put_u64, Checksummed, Header, Reader};
use self::states::Restored;
use super::{next_uid, MemoryStore, Shard};
use crate::penalty::MAX_PENALTY_MS;
use crate::store::MAX_TIME_MS;
use crate::{Clock, Limit, PenaltyState};

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SnapshotReport {
    /// (identity, limit) states written, or restored (idle ones dropped).
    pub states: usize,
    /// Penalty states written, or restored.
    pub penalties: usize,
    /// The file's size in bytes.
    pub bytes: u64,
    /// When the snapshot was written: ms since the epoch, by the store's clock.
    pub written_at_ms: u64,
}

/// Why a snapshot file could not be written or read back.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file (or its directory) could not be read.
    #[error("cannot read snapshot {}: {source}", path.display())]
    Read {
        /// The snapshot file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file could not be written; the snapshot before it, if any, is
    /// left as it was.
    #[error("cannot write snapshot {}: {source}", path.display())]
    Write {
        /// The snapshot file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file is not a whole snapshot this build can read.
    #[error("snapshot {} is unusable: {corruption}", path.display())]
    Corrupt {
        /// The snapshot file.
        path: PathBuf,
        /// What was wrong.
        corruption: Corruption,
    },
}

/// What is wrong with a snapshot's bytes. Nothing of such a file is restored.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Corruption {
    /// Shorter than the smallest snapshot.
    #[error("{len} bytes, too short for a snapshot (at least {min}): the file is truncated")]
    TooShort {
        /// The file's length.
        len: usize,
        /// The smallest snapshot's length.
        min: usize,
    },
    /// The file does not start as a snapshot does.
    #[error("it does not begin with the snapshot magic \"SLGSNAP\\0\": not a slidegate snapshot")]
    Magic,
    /// A format this build does not read.
    #[error("format version {found}; this slidegate reads version {expected}")]
    Version {
        /// The file's version.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The checksum does not match the contents.
    #[error("its checksum does not match its contents: the file is truncated or was altered")]
    Checksum,
    /// A value no snapshot holds, in a file whose checksum matched.
    #[error("at byte {at}: {what}")]
    Invalid {
        /// Where the value begins.
        at: usize,
        /// What is wrong with it.
        what: String,
    },
}

/// A penalty state's fields, in the order written.
const PENALTY_BYTES: usize = 8 + 5 * 8;
/// The latest time a penalty state holds: a block's end and its strikes'
/// memory lie at most two `max_block`s after the decision.
const LAST_PENALTY_MS: u64 = MAX_TIME_MS + 2 * MAX_PENALTY_MS;

impl<C: Clock> MemoryStore<C> {
    /// Writes a snapshot of the store to `out`: shard by shard, each
    /// encoded under its lock and written after it is released.
    ///
    /// # Errors
    /// What `out` returns.
    pub fn write_snapshot(&self, out: impl Write) -> io::Result<SnapshotReport> {
        let written_at_ms = self.clock.now_ms();
        let mut out = Checksummed::new(out);
        out.write_all(&Header { written_at_ms, seed: self.seed }.bytes())?;
        let mut report = SnapshotReport { written_at_ms, ..SnapshotReport::default() };
        let mut buffer = Vec::new();
        for shard in self.shards.iter() {
            buffer.clear();
            {
                let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
                report.states += write_shard(&shard, &mut buffer);
                report.penalties += shard.penalties().len();
            }
            out.write_all(&buffer)?;
        }
        out.write_all(&[format::END])?;
        let (mut out, bytes) = out.finish()?;
        out.flush()?;
        report.bytes = bytes;
        Ok(report)
    }

    /// Writes a snapshot to `path` atomically: to a temporary file in the
    /// same directory, synced, then renamed over `path` (and the directory
    /// synced). On an error the previous snapshot at `path` stays.
    ///
    /// # Errors
    /// [`SnapshotError::Write`].
    pub fn save_snapshot(&self, path: &Path) -> Result<SnapshotReport, SnapshotError> {
        file::write_atomically(path, |out| self.write_snapshot(out))
            .map_err(|source| SnapshotError::Write { path: path.to_owned(), source })
    }

    /// Replaces the store's state with the snapshot in `bytes`, decided from
    /// now on at the store's clock: states idle by now are dropped. The
    /// snapshot is checked whole first; on an error the store is unchanged.
    ///
    /// # Errors
    /// [`Corruption`] saying what is wrong with the bytes.
    pub fn restore_snapshot(&mut self, bytes: &[u8]) -> Result<SnapshotReport, Corruption> {
        let (header, mut input) = format::open(bytes)?;
        let (tables, penalties) = read_records(&mut input)?;
        let now = self.clock.now_ms();
        let mut shards: Box<[Mutex<Shard>]> = (0..self.shards.len()).map(|_| Mutex::default()).collect();
        self.seed = header.seed;
        self.hasher = foldhash::quality::FixedState::with_seed(header.seed);
        // Handles on the old tables must not match the new ones.
        self.uid = next_uid();
        let count = shards.len();
        let shard_of = |id: u64| (id >> 32) as usize % count;
        let mut report = SnapshotReport {
            bytes: bytes.len() as u64,
            written_at_ms: header.written_at_ms,
            ..SnapshotReport::default()
        };
        for (limit, restored) in tables {
            for (index, part) in restored.by_shard(&limit.quota, now, count, shard_of).into_iter().enumerate()
            {
                if part.len() > 0 {
                    report.states += part.len();
                    let shard = shards[index].get_mut().unwrap_or_else(PoisonError::into_inner);
                    part.restore_into(shard.table(&limit, now), now);
                }
            }
        }
        for (id, state) in penalties.into_iter().filter(|(_, p)| !p.is_idle(now)) {
            report.penalties += 1;
            shards[shard_of(id)].get_mut().unwrap_or_else(PoisonError::into_inner).restore_penalty(id, state);
        }
        std::mem::swap(&mut self.shards, &mut shards);
        Ok(report)
    }

    /// Restores the snapshot at `path` ([`MemoryStore::restore_snapshot`]);
    /// `None`, the store unchanged, when there is no file.
    ///
    /// # Errors
    /// [`SnapshotError::Read`] when the file exists but cannot be read,
    /// [`SnapshotError::Corrupt`] naming what is wrong with it.
    pub fn load_snapshot(&mut self, path: &Path) -> Result<Option<SnapshotReport>, SnapshotError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SnapshotError::Read { path: path.to_owned(), source }),
        };
        self.restore_snapshot(&bytes)
            .map(Some)
            .map_err(|corruption| SnapshotError::Corrupt { path: path.to_owned(), corruption })
    }
}

/// Appends one shard's records; how many states they hold.
fn write_shard(shard: &Shard, out: &mut Vec<u8>) -> usize {
    let mut states = 0;
    for table in shard.tables() {
        if table.len() > 0 {
            states += table.len();
            out.push(format::TABLE);
            states::write_table(table, out);
        }
    }
    if !shard.penalties().is_empty() {
        out.push(format::PENALTIES);
        put_u64(out, shard.penalties().len() as u64);
        for (&id, p) in shard.penalties() {
            for n in [id, p.denials, p.denials_until, p.block_until, p.strikes, p.strikes_until] {
                put_u64(out, n);
            }
        }
    }
    states
}

/// The records of a snapshot, read and checked: table records and penalty states.
type Records = (Vec<(Limit, Restored)>, Vec<(u64, PenaltyState)>);

fn read_records(input: &mut Reader<'_>) -> Result<Records, Corruption> {
    let (mut tables, mut penalties) = (Vec::new(), Vec::new());
    loop {
        let at = input.at();
        match input.u8("a record's kind")? {
            format::END => {
                input.finish()?;
                return Ok((tables, penalties));
            }
            format::TABLE => tables.push(states::read_table(input)?),
            format::PENALTIES => {
                let n = input.count(PENALTY_BYTES, "the penalty count")?;
                penalties.reserve(n);
                for _ in 0..n {
                    penalties.push(read_penalty(input)?);
                }
            }
            kind => return Err(input.invalid(at, format!("record kind {kind}: this build knows 0 to 2"))),
        }
    }
}

fn read_penalty(input: &mut Reader<'_>) -> Result<(u64, PenaltyState), Corruption> {
    let at = input.at();
    let id = input.u64("an identity")?;
    let mut fields = [0u64; 5];
    for f in &mut fields {
        *f = input.u64("a penalty field")?;
    }
    let [denials, denials_until, block_until, strikes, strikes_until] = fields;
    if id & 1 == 0 {
        return Err(input.invalid(at, format!("identity {id:#x}: stored ids are odd")));
    }
    if [denials_until, block_until, strikes_until].iter().any(|&t| t > LAST_PENALTY_MS) {
        return Err(input.invalid(at, "a penalty time past the year 9999"));
    }
    // Counts a process could reach, far from overflowing when incremented.
    if denials > 1 << 33 || strikes > 1 << 62 {
        return Err(input.invalid(at, format!("penalty counts {denials} denials, {strikes} strikes")));
    }
    Ok((id, PenaltyState { denials, denials_until, block_until, strikes, strikes_until }))
}
