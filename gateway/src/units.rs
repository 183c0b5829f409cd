//! Durations read from settings, and sizes written for people (`54.7 GB`, `448,304 tokens`) rather than
//! raw byte counts.

use std::time::Duration;

/// Parses `500` (milliseconds), `500ms`, `2s`, `1.5s`, `1m`, `1h`: finite, not negative, at most `max`.
///
/// # Errors
///
/// A sentence saying what is wrong and what is accepted.
///
/// # Examples
///
/// ```
/// use kvgate_gateway::units::parse_duration;
/// use std::time::Duration;
///
/// let day = Duration::from_secs(86_400);
/// assert_eq!(parse_duration("1.5s", day), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("1e300s", day).unwrap_err().contains("at most"));
/// ```
pub fn parse_duration(value: &str, max: Duration) -> Result<Duration, String> {
    let value = value.trim();
    let (number, scale) = [("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
        .iter()
        .find_map(|(unit, scale)| value.strip_suffix(unit).map(|n| (n, *scale)))
        .unwrap_or((value, 1e-3));
    let expected = "expected a duration like 500ms, 2s, 1.5s or 1m (a bare number is milliseconds)";
    let number: f64 = number.trim().parse().map_err(|_| expected.to_owned())?;
    if !number.is_finite() || number < 0.0 {
        return Err(format!("{expected}, finite and not negative"));
    }
    let seconds = number * scale;
    if seconds > max.as_secs_f64() {
        return Err(format!("at most {}", human_duration(max)));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{expected} ({e})"))
}

/// `1 day`, `2 h`, `30 s`, `250 ms`.
pub fn human_duration(d: Duration) -> String {
    match d.as_secs() {
        86_400 => "1 day".into(),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{} h", s / 3_600),
        s if s >= 1 => format!("{:.3} s", d.as_secs_f64()).replace(".000", ""),
        _ => format!("{} ms", d.as_millis()),
    }
}

/// Bytes in decimal units with three significant figures: `512 B`, `4.19 MB`, `54.7 GB`, `13.1 TB`.
///
/// # Examples
///
/// ```
/// assert_eq!(kvgate_gateway::units::bytes(13_107_202_097_152), "13.1 TB");
/// assert_eq!(kvgate_gateway::units::bytes(512), "512 B");
/// ```
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 999.5 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{n} B");
    }
    let decimals = if value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {}", UNITS[unit])
}

/// A token count with thousands separators: `448,304 tokens`.
///
/// # Examples
///
/// ```
/// assert_eq!(kvgate_gateway::units::tokens(448_304), "448,304 tokens");
/// ```
pub fn tokens(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 7);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out.push_str(if n == 1 { " token" } else { " tokens" });
    out
}

/// A KV amount in the admission's unit: `bytes` or `tokens`; `unlimited` for `u64::MAX`.
pub fn kv(n: u64, in_bytes: bool) -> String {
    match (n, in_bytes) {
        (u64::MAX, _) => "unlimited".into(),
        (n, true) => bytes(n),
        (n, false) => tokens(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let day = Duration::from_secs(86_400);
        assert_eq!(parse_duration("250", day), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m", day), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h", day), Ok(Duration::from_secs(3600)));
        for bad in ["1e300s", "inf", "NaN", "-1s", "x", "", "2d", "1e20"] {
            assert!(parse_duration(bad, day).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_000), "1.00 kB");
        assert_eq!(bytes(4_194_304), "4.19 MB");
        assert_eq!(bytes(54_730_000_000), "54.7 GB");
        assert_eq!(bytes(u64::MAX), "18447 PB");
        assert_eq!(tokens(1), "1 token");
        assert_eq!(tokens(1_000_000), "1,000,000 tokens");
        assert_eq!(kv(u64::MAX, true), "unlimited");
    }
}
