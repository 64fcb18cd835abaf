//! Human-friendly sizes and durations, as used on the command line and in profiles.

use std::time::Duration;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 30s or 2m"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    if !(secs > 0.0 && secs <= 24.0 * 3600.0) {
        return Err(format!("{s:?} must be between 0 and 24h"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// [`parse_duration`], where zero (`0s`, `0ms`, `0`) is also a value: for settings whose
/// zero means "never" (`upstream_wait`).
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let zero = num.parse::<f64>().is_ok_and(|v| v == 0.0);
    if zero && matches!(unit, "" | "s" | "ms" | "m" | "h") {
        return Ok(Duration::ZERO);
    }
    parse_duration(s).map_err(|e| {
        if e.contains("between 0 and 24h") {
            format!("{t:?} must be from 0 to 24h")
        } else {
            e
        }
    })
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 512K, 256M or 1G"))?;
    let mult: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use K, M or G")),
    };
    value
        .checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_that_may_be_zero() {
        for zero in ["0s", "0", "0ms", " 0.0s ", "0h"] {
            assert_eq!(
                parse_duration_or_zero(zero).unwrap(),
                Duration::ZERO,
                "{zero}"
            );
        }
        assert_eq!(
            parse_duration_or_zero("10s").unwrap(),
            Duration::from_secs(10)
        );
        for bad in ["-1s", "0x", "", "25h", "s"] {
            assert!(parse_duration_or_zero(bad).is_err(), "{bad}");
        }
        assert!(parse_duration_or_zero("25h")
            .unwrap_err()
            .contains("from 0 to 24h"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("0").is_err());
        assert_eq!(parse_duration("5h").unwrap(), Duration::from_secs(5 * 3600));
        assert!(parse_duration("25h").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("abc").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("10").unwrap(), 10);
        assert!(parse_size("1T").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
