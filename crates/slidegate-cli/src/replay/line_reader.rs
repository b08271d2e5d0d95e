//! Lines of a log in bounded memory: a line longer than [`MAX_LINE`] is
//! skipped to its end and reported as too long, however long it is, so a
//! log without a newline in gigabytes costs no more memory than a good one.

use std::io::{self, BufRead};

/// The longest line read; longer ones are malformed. An access log line is
/// a request line (nginx refuses one over 8 KiB by default) and a few
/// fields: 64 KiB is far above any real one.
pub const MAX_LINE: usize = 64 * 1024;

/// A line as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// Its bytes, without `\n` or `\r\n`.
    Text(&'a [u8]),
    /// Longer than [`MAX_LINE`]: its length in bytes.
    TooLong(u64),
}

/// Reads lines from `R`, counting the bytes consumed.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes consumed so far.
    pub consumed: u64,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(inner: R) -> Self {
        Self { inner, buf: Vec::new(), consumed: 0 }
    }

    /// The next line, `None` at the end.
    ///
    /// # Errors
    /// What reading `R` fails with.
    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let (mut length, mut any) = (0u64, false);
        loop {
            let available = match self.inner.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                if !any {
                    return Ok(None);
                }
                break;
            }
            any = true;
            let newline = available.iter().position(|&b| b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            length += chunk.len() as u64;
            if length <= MAX_LINE as u64 {
                self.buf.extend_from_slice(chunk);
            } else if !self.buf.is_empty() {
                self.buf = Vec::new();
            }
            let used = chunk.len() + usize::from(newline.is_some());
            self.inner.consume(used);
            self.consumed += used as u64;
            if newline.is_some() {
                break;
            }
        }
        if length > MAX_LINE as u64 {
            return Ok(Some(Line::TooLong(length)));
        }
        let line = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
        Ok(Some(Line::Text(line)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], capacity: usize) -> Vec<Result<Vec<u8>, u64>> {
        let mut reader = LineReader::new(io::BufReader::with_capacity(capacity, input));
        let mut out = Vec::new();
        while let Some(line) = reader.next_line().unwrap() {
            out.push(match line {
                Line::Text(t) => Ok(t.to_vec()),
                Line::TooLong(n) => Err(n),
            });
        }
        assert_eq!(reader.consumed, input.len() as u64);
        out
    }

    #[test]
    fn lines_split_on_newlines_across_buffer_boundaries() {
        for capacity in [1, 3, 8192] {
            assert_eq!(
                lines(b"ab\r\n\ncd\nlast", capacity),
                [Ok(b"ab".to_vec()), Ok(vec![]), Ok(b"cd".to_vec()), Ok(b"last".to_vec())]
            );
            assert_eq!(lines(b"", capacity), []);
            assert_eq!(lines(b"x\n", capacity), [Ok(b"x".to_vec())]);
        }
    }

    #[test]
    fn a_line_too_long_is_skipped_whole_and_measured() {
        let mut input = vec![b'a'; MAX_LINE + 1];
        input.extend_from_slice(b"\nnext\n");
        input.extend(vec![b'b'; MAX_LINE]);
        let got = lines(&input, 4096);
        assert_eq!(got, [Err(MAX_LINE as u64 + 1), Ok(b"next".to_vec()), Ok(vec![b'b'; MAX_LINE])]);
    }
}
