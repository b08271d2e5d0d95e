//! A bad value quoted in a line's reason, cut short.

/// At most 40 characters of `s`, for an error message (a line's reasons,
/// in `access_log` and `timestamp`).
pub(super) fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
