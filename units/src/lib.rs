//! Human-readable sizes and durations for command lines ("4MiB", "64k",
//! "500ms", "2m"): one place shared by the `tailflight` binary and the
//! benchmark tools.

use std::time::Duration;

/// A size or duration that does not parse: the user's input, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct UnitError {
    /// "size" or "duration".
    pub what: &'static str,
    pub input: String,
    pub reason: String,
}

fn invalid(what: &'static str, input: &str, reason: impl Into<String>) -> UnitError {
    UnitError {
        what,
        input: input.to_owned(),
        reason: reason.into(),
    }
}

/// Parses a byte size: a number (fractions allowed) followed by an optional unit.
///
/// Bare `K`/`M`/`G`/`T` and the IEC forms `KiB`/`MiB`/`GiB`/`TiB` are powers of 1024;
/// the SI forms `kB`/`MB`/`GB`/`TB` are powers of 1000, so "64k" is 65536 and "1MB" is
/// 1000000. `B` or no unit means bytes. Units are case-insensitive and may be separated
/// from the number by spaces. Fractional results are rounded to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let bad = |reason: String| invalid("size", s, reason);
    let (number, unit) = split_number(s.trim())
        .ok_or_else(|| bad("expected e.g. \"4MiB\", \"64k\", \"100B\"".into()))?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(bad(format!(
                "unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB, or kB/MB/GB/TB for \
                 powers of 1000)"
            )));
        }
    };
    let bytes = scale(number, u128::from(multiplier)).map_err(bad)?;
    u64::try_from(bytes).map_err(|_| bad("it does not fit in 64 bits".into()))
}

/// Parses a duration: one or more number+unit pairs such as "10s", "500ms", "2m",
/// "1h30m" or "1.5s". Units are `ns`, `us` (or `µs`), `ms`, `s`, `m` (or `min`) and `h`.
/// A bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let bad = |reason: String| invalid("duration", s, reason);
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("empty".into()));
    }
    let mut rest = text;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(bad(format!("expected a number at {rest:?}")));
        }
        let number = &rest[..num_len];
        let after = rest[num_len..].trim_start();
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let unit = &after[..unit_len];
        let nanos_per_unit: u128 = match unit {
            // A bare number is only accepted on its own: "1m30" is more likely a typo.
            "" if rest.len() == text.len() && after.is_empty() => 1_000_000_000,
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" | "sec" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad(format!("number {number:?} has no unit"))),
            _ => {
                return Err(bad(format!(
                    "unknown unit {unit:?} (use ns, us, ms, s, m, h)"
                )));
            }
        };
        let nanos = scale(number, nanos_per_unit).map_err(bad)?;
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| bad("it is too long".into()))?;
        rest = after[unit_len..].trim_start();
    }
    let secs =
        u64::try_from(total_nanos / 1_000_000_000).map_err(|_| bad("it is too long".into()))?;
    Ok(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

/// Splits "12.5 MiB" into ("12.5", "MiB"); none without a leading number.
fn split_number(s: &str) -> Option<(&str, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], s[end..].trim()))
}

/// `number * multiplier`, exact for integers, rounded for fractions.
fn scale(number: &str, multiplier: u128) -> Result<u128, String> {
    if !number.contains('.') {
        let n: u128 = number
            .parse()
            .map_err(|_| format!("bad number {number:?}"))?;
        return n
            .checked_mul(multiplier)
            .ok_or_else(|| format!("{number:?} is too large"));
    }
    let n: f64 = number
        .parse()
        .map_err(|_| format!("bad number {number:?}"))?;
    let v = (n * multiplier as f64).round();
    if !v.is_finite() || v < 0.0 || v >= u128::MAX as f64 {
        return Err(format!("{number:?} is out of range"));
    }
    Ok(v as u128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("64k").unwrap(), 65_536);
        assert_eq!(parse_size("64K").unwrap(), 65_536);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("4 MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("4m").unwrap(), 4 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
        assert_eq!(parse_size("10kB").unwrap(), 10_000);
        assert_eq!(parse_size("1.5MiB").unwrap(), 3 << 19);
        assert_eq!(parse_size(" 0 ").unwrap(), 0);
        for bad in [
            "",
            "MiB",
            "4XB",
            "-1",
            "1.2.3k",
            "99999999999999999999T",
            "4 Mi B",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        let err = parse_size("4XB").unwrap_err().to_string();
        assert!(err.contains("4XB"), "error names the input: {err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("7ns").unwrap(), Duration::from_nanos(7));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for bad in ["", "s", "10x", "-1s", "1m30", "1..5s", "ms10"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
