//! Durations on the command line, in one convention: a bare number is in the unit the
//! option's name or help gives (seconds when it names none), and any value may carry its
//! own unit instead: `1.5s`, `200ms`, `250us`, `2m`, `1h 30m` (the `humantime` forms).

use std::time::Duration;

/// `v` as a duration; a bare number counts in `unit`.
pub fn parse(v: &str, unit: Duration) -> Result<Duration, String> {
    let v = v.trim();
    let scaled = |x: f64, unit: Duration| -> Result<Duration, String> {
        if !x.is_finite() || x < 0.0 {
            return Err(format!("{v:?} is not a duration of 0 or more"));
        }
        Duration::try_from_secs_f64(x * unit.as_secs_f64())
            .map_err(|_| format!("{v:?} is too long a duration"))
    };
    if let Ok(x) = v.parse::<f64>() {
        return scaled(x, unit);
    }
    // a decimal number with one unit (`1.5s`, `0.2ms`), which humantime does not take
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(split);
    if let Ok(x) = number.parse::<f64>() {
        let unit = match suffix.trim() {
            "ns" => Some(Duration::from_nanos(1)),
            "us" | "µs" => Some(Duration::from_micros(1)),
            "ms" => Some(Duration::from_millis(1)),
            "s" | "sec" | "secs" => Some(Duration::from_secs(1)),
            "m" | "min" | "mins" => Some(Duration::from_secs(60)),
            "h" | "hr" | "hrs" => Some(Duration::from_secs(3600)),
            _ => None,
        };
        if let Some(unit) = unit {
            return scaled(x, unit);
        }
    }
    humantime::parse_duration(v).map_err(|e| {
        format!("{v:?} is not a duration: give a number, or one with a unit (500ms, 2s, 1m): {e}")
    })
}

/// A seconds option (`--timeout 30`, `--timeout 500ms`), as the seconds it holds.
pub fn secs(v: &str) -> Result<f64, String> {
    parse(v, Duration::from_secs(1)).map(|d| d.as_secs_f64())
}

/// A milliseconds option (`--slow-ms 5`, `--slow-ms 1s`), in whole milliseconds.
pub fn millis(v: &str) -> Result<u64, String> {
    parse(v, Duration::from_millis(1)).map(|d| d.as_millis() as u64)
}

/// A microseconds option (`--flush-us 200`, `--flush-us 1ms`), in whole microseconds.
pub fn micros(v: &str) -> Result<u64, String> {
    parse(v, Duration::from_micros(1)).map(|d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_numbers_keep_their_unit_and_units_convert() {
        assert_eq!(secs("5").unwrap(), 5.0);
        assert_eq!(secs("2.5").unwrap(), 2.5);
        assert_eq!(secs("5s").unwrap(), 5.0);
        assert_eq!(secs("200ms").unwrap(), 0.2);
        assert_eq!(secs("1.5s").unwrap(), 1.5);
        assert_eq!(secs("2m").unwrap(), 120.0);
        assert_eq!(secs("1m 30s").unwrap(), 90.0);
        assert_eq!(millis("5").unwrap(), 5);
        assert_eq!(millis("1s").unwrap(), 1000);
        assert_eq!(millis("250us").unwrap(), 0);
        assert_eq!(micros("200").unwrap(), 200);
        assert_eq!(micros("1ms").unwrap(), 1000);
        assert_eq!(micros("0.5ms").unwrap(), 500);
        for bad in ["", "-1", "5 parsecs", "s", "nan", "inf"] {
            assert!(secs(bad).is_err(), "{bad:?} taken");
        }
    }
}
