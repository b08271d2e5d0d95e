//! The snapshot file's layout: its header, its records and its checksum,
//! and a reader that checks every length against the bytes left before it
//! trusts it.
//!
//! ```text
//! header   magic "SLGSNAP\0" | version u32 | flags u32 (0) | written_at_ms u64 | seed u64
//! records  kind u8, then the record (see `states.rs`), until kind END
//! trailer  BLAKE3 of every byte before it (32 bytes)
//! ```
//!
//! Every integer is little-endian. A record's count is checked against the
//! bytes left times the least a state takes, so a forged count can never
//! make the reader allocate more than the file's own size.

use std::io::{self, Write};

use super::Corruption;

/// The first bytes of every snapshot.
pub(super) const MAGIC: [u8; 8] = *b"SLGSNAP\0";
/// The format this build writes and reads.
pub(super) const VERSION: u32 = 1;
/// Magic, version, flags, written-at and seed.
pub(super) const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
/// The BLAKE3 hash that ends the file.
pub(super) const CHECKSUM_BYTES: usize = 32;
/// The smallest file: a header, an end mark and the checksum.
pub(super) const MIN_BYTES: usize = HEADER_BYTES + 1 + CHECKSUM_BYTES;

/// Record kinds.
pub(super) const END: u8 = 0;
pub(super) const TABLE: u8 = 1;
pub(super) const PENALTIES: u8 = 2;

/// The header's values.
pub(super) struct Header {
    pub(super) written_at_ms: u64,
    pub(super) seed: u64,
}

impl Header {
    pub(super) fn bytes(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        // 12..16: flags, none yet.
        out[16..24].copy_from_slice(&self.written_at_ms.to_le_bytes());
        out[24..32].copy_from_slice(&self.seed.to_le_bytes());
        out
    }
}

/// Checks the frame of `bytes` (length, magic, version, flags, checksum) and
/// returns the header and a reader over the records.
pub(super) fn open(bytes: &[u8]) -> Result<(Header, Reader<'_>), Corruption> {
    // A file cut inside its magic is reported as cut, not as foreign.
    if bytes.len() < MIN_BYTES && MAGIC.starts_with(&bytes[..bytes.len().min(MAGIC.len())]) {
        return Err(Corruption::TooShort { len: bytes.len(), min: MIN_BYTES });
    }
    if !bytes.starts_with(&MAGIC) {
        return Err(Corruption::Magic);
    }
    let mut header = Reader { bytes, at: MAGIC.len() };
    let version = header.u32("the format version")?;
    if version != VERSION {
        return Err(Corruption::Version { found: version, expected: VERSION });
    }
    if bytes.len() < MIN_BYTES {
        return Err(Corruption::TooShort { len: bytes.len(), min: MIN_BYTES });
    }
    let (body, checksum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if blake3::hash(body).as_bytes() != checksum {
        return Err(Corruption::Checksum);
    }
    let mut header = Reader { bytes: body, at: header.at };
    let flags = header.u32("the flags")?;
    if flags != 0 {
        return Err(header.invalid(12, format!("flags {flags:#x}: this build knows none")));
    }
    let written_at_ms = header.u64("the time written")?;
    let seed = header.u64("the seed")?;
    Ok((Header { written_at_ms, seed }, header))
}

/// Reads the records of a snapshot whose frame [`open`] checked; every
/// error names the byte it was found at.
pub(super) struct Reader<'a> {
    /// The file up to its checksum.
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Where the next read starts.
    pub(super) fn at(&self) -> usize {
        self.at
    }

    /// Bytes left before the checksum.
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The error for a value found wrong at byte `at`.
    pub(super) fn invalid(&self, at: usize, what: impl Into<String>) -> Corruption {
        Corruption::Invalid { at, what: what.into() }
    }

    /// The next `n` bytes, holding `what`.
    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Corruption> {
        if n > self.left() {
            return Err(self.invalid(
                self.at,
                format!("{what} needs {n} bytes, {} are left before the checksum", self.left()),
            ));
        }
        let taken = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(taken)
    }

    pub(super) fn u8(&mut self, what: &str) -> Result<u8, Corruption> {
        Ok(self.take(1, what)?[0])
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, Corruption> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, Corruption> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }

    /// A count of items of at least `each` bytes, checked against the
    /// bytes left: what may be allocated for them is at most the file's size.
    pub(super) fn count(&mut self, each: usize, what: &str) -> Result<usize, Corruption> {
        let at = self.at;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| n.checked_mul(each).is_some_and(|b| b <= self.left()));
        fits.ok_or_else(|| {
            self.invalid(
                at,
                format!(
                    "{what} is {n}, which would need at least {each} bytes each; {} are left",
                    self.left()
                ),
            )
        })
    }

    /// Whether every byte before the checksum was read.
    pub(super) fn finish(&self) -> Result<(), Corruption> {
        match self.left() {
            0 => Ok(()),
            n => Err(self.invalid(self.at, format!("{n} bytes follow the end mark"))),
        }
    }
}

/// A writer that hashes what passes through it, for the trailer.
pub(super) struct Checksummed<W> {
    pub(super) inner: W,
    hasher: blake3::Hasher,
    written: u64,
}

impl<W: Write> Checksummed<W> {
    pub(super) fn new(inner: W) -> Self {
        Self { inner, hasher: blake3::Hasher::new(), written: 0 }
    }

    /// Writes the checksum of everything written so far; the bytes written in all.
    pub(super) fn finish(mut self) -> io::Result<(W, u64)> {
        let checksum = *self.hasher.finalize().as_bytes();
        self.inner.write_all(&checksum)?;
        Ok((self.inner, self.written + CHECKSUM_BYTES as u64))
    }
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Appends `n` little-endian.
pub(super) fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}
