//! Times as access logs write them, read into milliseconds since the Unix
//! epoch: the common log format's `10/Oct/2000:13:55:36 -0700`, RFC 3339,
//! and unix seconds or milliseconds. Fixed forms, read by hand: a date crate
//! would add more than these few functions.
//!
//! Every time is checked to lie in what the stores decide on, 1970 to the
//! end of year 9999 ([`slidegate::store::MAX_TIME_MS`]); a replay takes
//! only those of a [`Recorded`] range.

use slidegate::store::MAX_TIME_MS;

use super::clip::clip;

const MS_PER_DAY: i64 = 86_400_000;
const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// A unix time of 10^11 or more is taken for milliseconds: as seconds it
/// would be after the year 5000, as milliseconds it is March 1973.
const MS_FROM: f64 = 1e11;

/// 2000-01-01T00:00:00Z.
const Y2K_MS: u64 = 946_684_800_000;

/// How far past the replaying machine's clock a line may be dated: a day
/// covers a writer's clock running ahead and a mislabelled time zone.
const AHEAD_MS: u64 = MS_PER_DAY as u64;

/// The times a recorded request can carry: from 2000-01-01 to a day after
/// the replaying machine's clock. A line dated outside is no request a log
/// recorded (1970 is a writer whose clock was unset, 9999 a forged line),
/// and replaying it would move the simulated clock across decades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub from_ms: u64,
    pub until_ms: u64,
}

impl Recorded {
    /// The range for a replay run when the machine's clock reads `now_ms`.
    pub fn at(now_ms: u64) -> Self {
        Self { from_ms: Y2K_MS, until_ms: now_ms.saturating_add(AHEAD_MS) }
    }

    /// Whether `time_ms` is in the range, and if not, why.
    pub fn check(&self, time_ms: u64) -> Result<(), String> {
        if time_ms < self.from_ms {
            Err(format!("time {} is before {}", format_rfc3339(time_ms), format_rfc3339(self.from_ms)))
        } else if time_ms > self.until_ms {
            Err(format!(
                "time {} is after {}, a day past this machine's clock",
                format_rfc3339(time_ms),
                format_rfc3339(self.until_ms),
            ))
        } else {
            Ok(())
        }
    }
}

/// `10/Oct/2000:13:55:36 -0700` (nginx `$time_local`, Apache `%t`).
pub fn parse_common_log(s: &str) -> Result<u64, String> {
    let bad = || format!("time {:?} is not of the form 10/Oct/2000:13:55:36 -0700", clip(s));
    let b = s.as_bytes();
    if !s.is_ascii()
        || b.len() != 26
        || b[2] != b'/'
        || b[6] != b'/'
        || b[11] != b':'
        || b[14] != b':'
        || b[17] != b':'
        || b[20] != b' '
    {
        return Err(bad());
    }
    let month = MONTHS.iter().position(|m| m.as_bytes() == &b[3..6]).ok_or_else(bad)? as u32 + 1;
    let offset = offset_minutes(&s[21..22], &s[22..24], &s[24..26]).ok_or_else(bad)?;
    let field = |range: std::ops::Range<usize>| digits(&s[range]).ok_or_else(bad);
    civil_ms(field(7..11)?, month, field(0..2)?, field(12..14)?, field(15..17)?, field(18..20)?, 0, offset)
}

/// RFC 3339: `2026-12-01T10:00:00Z`, with a fraction of a second and an
/// offset (`+01:00`) optional; `t`, `z` and a space for `T` accepted.
pub fn parse_rfc3339(s: &str) -> Result<u64, String> {
    let bad = || format!("time {:?} is not RFC 3339 (2026-12-01T10:00:00Z)", clip(s));
    let b = s.as_bytes();
    if !s.is_ascii()
        || b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let field = |range: std::ops::Range<usize>| digits(&s[range]).ok_or_else(bad);
    let (year, month, day) = (field(0..4)?, field(5..7)?, field(8..10)?);
    let (hour, minute, second) = (field(11..13)?, field(14..16)?, field(17..19)?);
    let mut rest = &s[19..];
    let mut ms = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let n = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return Err(bad());
        }
        // Milliseconds: the first three digits, the rest dropped.
        let first3 = format!("{:0<3}", &fraction[..n.min(3)]);
        ms = digits(&first3).ok_or_else(bad)?;
        rest = &fraction[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            offset_minutes(&rest[..1], &rest[1..3], &rest[4..6]).ok_or_else(bad)?
        }
        _ => return Err(bad()),
    };
    civil_ms(year, month, day, hour, minute, second, ms, offset)
}

/// Unix seconds (possibly with a fraction), or milliseconds from 10^11 on.
pub fn from_unix(n: f64) -> Result<u64, String> {
    let bad = |why: &str| format!("time {n} {why}");
    if !n.is_finite() || n < 0.0 {
        return Err(bad("is not a unix time (seconds or milliseconds since 1970)"));
    }
    let ms = if n >= MS_FROM { n } else { n * 1000.0 };
    if ms > MAX_TIME_MS as f64 {
        return Err(bad("is after the year 9999"));
    }
    Ok(ms as u64)
}

/// `ms` as RFC 3339 in UTC, with milliseconds only when there are some.
pub fn format_rfc3339(ms: u64) -> String {
    let days = (ms / MS_PER_DAY as u64) as i64;
    let (year, month, day) = civil_from_days(days);
    let in_day = ms % MS_PER_DAY as u64;
    let (h, m, s, frac) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    if frac == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{frac:03}Z")
    }
}

/// A span of time for people: `9 s`, `12 min 5 s`, `3 h 20 min`, `2 d 4 h`.
pub fn format_span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 if !ms.is_multiple_of(1000) => format!("{:.1} s", ms as f64 / 1000.0),
        0..60 => format!("{s} s"),
        60..3600 => two(s / 60, "min", s % 60, "s"),
        3600..86_400 => two(s / 3600, "h", s / 60 % 60, "min"),
        _ => two(s / 86_400, "d", s / 3600 % 24, "h"),
    }
}

/// `3 h 20 min`, or `3 h` when the smaller part is 0.
fn two(big: u64, big_unit: &str, small: u64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big} {big_unit}")
    } else {
        format!("{big} {big_unit} {small} {small_unit}")
    }
}

/// The time at the given UTC-offset civil date and time, checked field by field.
#[allow(clippy::too_many_arguments)]
fn civil_ms(
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    ms: u32,
    offset_minutes: i64,
) -> Result<u64, String> {
    if !(1..=12).contains(&month) {
        return Err(format!("month {month} is not from 1 to 12"));
    }
    if !(1..=days_in_month(year, month)).contains(&day) {
        return Err(format!("day {day} is not in month {month} of {year}"));
    }
    // A leap second (60) reads as the last millisecond before the next minute.
    if hour > 23 || minute > 59 || second > 60 {
        return Err(format!("time of day {hour:02}:{minute:02}:{second:02} is out of range"));
    }
    let (second, ms) = if second == 60 { (59, 999) } else { (second, ms) };
    let days = days_from_civil(i64::from(year), month, day);
    let total = days * MS_PER_DAY
        + i64::from(hour) * 3_600_000
        + i64::from(minute) * 60_000
        + i64::from(second) * 1000
        + i64::from(ms)
        - offset_minutes * 60_000;
    match u64::try_from(total) {
        Ok(t) if t <= MAX_TIME_MS => Ok(t),
        Ok(_) => Err(format!("year {year} is after 9999")),
        Err(_) => Err(format!("year {year} is before 1970")),
    }
}

/// `+HHMM` or `-HHMM` (the sign, hours and minutes apart) as minutes east of UTC.
fn offset_minutes(sign: &str, hours: &str, minutes: &str) -> Option<i64> {
    let (h, m) = (i64::from(digits(hours)?), i64::from(digits(minutes)?));
    if h > 23 || m > 59 {
        return None;
    }
    match sign {
        "+" => Some(h * 60 + m),
        "-" => Some(-(h * 60 + m)),
        _ => None,
    }
}

/// ASCII digits only (no sign, no spaces) as a number.
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`: eras of 400 years, years starting in March).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * i64::from((month + 9) % 12) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T10:00:00Z (`date -u -d 2026-12-01T10:00:00Z +%s`).
    const T: u64 = 1_796_119_200_000;

    #[test]
    fn the_common_log_format_reads_with_its_offset() {
        assert_eq!(parse_common_log("01/Dec/2026:10:00:00 +0000"), Ok(T));
        assert_eq!(parse_common_log("01/Dec/2026:03:00:00 -0700"), Ok(T));
        assert_eq!(parse_common_log("10/Oct/2000:13:55:36 -0700"), Ok(971_211_336_000));
        assert_eq!(parse_common_log("29/Feb/2024:00:00:00 +0000"), Ok(1_709_164_800_000));
        for bad in [
            "32/Dec/2026:10:00:00 +0000",
            "29/Feb/2026:10:00:00 +0000",
            "01/Foo/2026:10:00:00 +0000",
            "01/Dec/2026:24:00:00 +0000",
            "01/Dec/2026:10:00:00 +2400",
            "01/Dec/2026:10:00:00 *0000",
            "01/Dec/2026:10:00:0",
            "01/Dec/1969:10:00:00 +0000",
            "+1/Dec/2026:10:00:00 +0000",
            "01/Dé/2026:10:00:00 +000",
            "",
        ] {
            assert!(parse_common_log(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rfc3339_reads_fractions_and_offsets() {
        assert_eq!(parse_rfc3339("2026-12-01T10:00:00Z"), Ok(T));
        assert_eq!(parse_rfc3339("2026-12-01T11:00:00+01:00"), Ok(T));
        assert_eq!(parse_rfc3339("2026-12-01 10:00:00.25z"), Ok(T + 250));
        assert_eq!(parse_rfc3339("2026-12-01t10:00:00.123456Z"), Ok(T + 123));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59.999Z"), Ok(MAX_TIME_MS));
        for bad in [
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:00.Z",
            "2026-13-01T10:00:00Z",
            "2026-12-01T10:00:00+1:00",
            "1970-01-01T00:00:00+00:01",
            "yesterday",
            "2026-12-01T10:00:00Zjunk",
            "2026-12-01T10:00:0é+01:00",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unix_times_are_seconds_or_milliseconds() {
        assert_eq!(from_unix(1_796_119_200.0), Ok(T));
        assert_eq!(from_unix(1_796_119_200.5), Ok(T + 500));
        assert_eq!(from_unix(T as f64), Ok(T));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
            assert!(from_unix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_recorded_time_is_from_2000_to_a_day_ahead() {
        let range = Recorded::at(T);
        let day = 86_400_000;
        for ok in [Y2K_MS, T, T + day] {
            assert_eq!(range.check(ok), Ok(()));
        }
        assert_eq!(
            range.check(Y2K_MS - 1),
            Err("time 1999-12-31T23:59:59.999Z is before 2000-01-01T00:00:00Z".into())
        );
        assert_eq!(
            range.check(T + day + 1),
            Err("time 2026-12-02T10:00:00.001Z is after 2026-12-02T10:00:00Z, a day past this machine's clock".into())
        );
        assert!(range.check(0).is_err() && range.check(MAX_TIME_MS).is_err());
        assert_eq!(Recorded::at(u64::MAX).until_ms, u64::MAX, "saturates");
    }

    #[test]
    fn formatting_is_the_inverse_of_parsing() {
        for ms in [0, T, T + 7, 951_782_400_000, MAX_TIME_MS] {
            assert_eq!(parse_rfc3339(&format_rfc3339(ms)), Ok(ms), "{ms}");
        }
        assert_eq!(format_rfc3339(T), "2026-12-01T10:00:00Z");
        assert_eq!(format_span(9_000), "9 s");
        assert_eq!(format_span(1_500), "1.5 s");
        assert_eq!(format_span(725_000), "12 min 5 s");
        assert_eq!(format_span(60_000), "1 min");
        assert_eq!(format_span(2 * 86_400_000 + 3_600_000), "2 d 1 h");
    }
}
