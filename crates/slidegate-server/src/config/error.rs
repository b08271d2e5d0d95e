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
    /// Several problems in independent parts of the file, in file order:
    /// each an [`ConfigError::Invalid`], printed one after the other.
    #[error("{}", Several(errors))]
    Several {
        /// The problems, at least two.
        errors: Vec<ConfigError>,
    },
}

/// Each error on its own line (with its excerpt), then how many there were.
struct Several<'a>(&'a [ConfigError]);

impl std::fmt::Display for Several<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for error in self.0 {
            writeln!(f, "{error}")?;
        }
        write!(f, "{} errors", self.0.len())
    }
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

    /// `(line, column)` of an invalid configuration (of its first problem
    /// when there are several); `None` for a read error.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            ConfigError::Invalid { line, column, .. } => Some((*line, *column)),
            ConfigError::Read { .. } => None,
            ConfigError::Several { errors } => errors.first().and_then(ConfigError::location),
        }
    }

    /// Every problem found, in file order: the errors of a
    /// [`ConfigError::Several`], or this one alone.
    ///
    /// ```
    /// use slidegate_server::Config;
    ///
    /// let text = "[server]\nlisten = 1\n[store]\ntimeout_ms = 0\n";
    /// let err = Config::parse(text, "demo.toml").unwrap_err();
    /// let lines: Vec<(usize, usize)> = err.errors().iter().filter_map(|e| e.location()).collect();
    /// assert_eq!(lines, [(2, 10), (4, 14)]);
    /// ```
    pub fn errors(&self) -> &[ConfigError] {
        match self {
            ConfigError::Several { errors } => errors,
            one => std::slice::from_ref(one),
        }
    }

    /// `errors`, one error, or several in file order: the error of a file
    /// in which `errors` were found (`None` when none was).
    pub(crate) fn from_found(mut errors: Vec<ConfigError>) -> Option<Self> {
        errors.sort_by_key(|e| e.location());
        errors.dedup_by(|a, b| a.to_string() == b.to_string());
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(ConfigError::Several { errors }),
        }
    }
}
