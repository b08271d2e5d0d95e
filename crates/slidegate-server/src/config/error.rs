//! [`ConfigError`]: why a configuration could not be used, located by file,
//! line and column.

use std::path::PathBuf;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error("{}:{line}:{column}: {message}{snippet}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column (in characters) of the offending value.
        column: usize,
        /// What was wrong and what was expected.
        message: String,
        /// The offending source line with a caret under the value, starting with a newline.
        snippet: String,
    },
}

impl ConfigError {
    /// An [`ConfigError::Invalid`] at byte range `span` of `source` (the
    /// start of the file when the parser gave no position).
    pub(crate) fn at(
        path: &std::path::Path,
        source: &str,
        span: Option<std::ops::Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        let offset = span.as_ref().map_or(0, |s| s.start.min(source.len()));
        let before = &source[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = source[line_start..offset].chars().count() + 1;
        let line_text = source[line_start..].lines().next().unwrap_or("");
        let width = span
            .map(|s| {
                source[offset..s.end.min(source.len()).max(offset)].chars().take_while(|c| *c != '\n').count()
            })
            .unwrap_or(1)
            .max(1);
        let gutter = line.to_string().len();
        let snippet = format!(
            "\n{pad} |\n{line} | {line_text}\n{pad} | {spaces}{carets}",
            pad = " ".repeat(gutter),
            spaces = " ".repeat(column - 1),
            carets = "^".repeat(width),
        );
        let message: String = message.into();
        ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            message: message.trim().to_owned(),
            snippet,
        }
    }

    /// `(line, column)` of an invalid configuration; `None` for a read error.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            ConfigError::Invalid { line, column, .. } => Some((*line, *column)),
            ConfigError::Read { .. } => None,
        }
    }
}
