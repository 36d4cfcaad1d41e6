//! Durations as people write them in gpuscale's configuration files and
//! flags (`30s`, `5m`, `1h 30m`: humantime's syntax), bounded.
//!
//! Unbounded, a duration like `300000000000y` parses (humantime reads up
//! to `u64::MAX` seconds) and then overflows wherever it is added to a
//! clock reading: a gateway worker panicked on every request with such a
//! `requestTimeout` while its health checks passed. Nothing gpuscale
//! waits for or measures is longer than [`MAX`], so a longer duration is
//! refused where it is read, with the file, line and field, like any
//! other bad value. Use it as `#[serde(with = "gpuscale_policies::duration")]`
//! (or `duration::option`), and [`parse`] as a clap value parser.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// The longest duration taken: a year (365.25 days, humantime's `1year`).
pub const MAX: Duration = Duration::from_secs(31_557_600);

/// `d` written back in days, hours, minutes, seconds, milliseconds,
/// microseconds and nanoseconds (`366d`, `1d 1h`, `1m 30s`, `250ms`,
/// `1d 1ns`, `0s`): the units a file uses,
/// not humantime's months and years, whose lengths (30.44 and 365.25
/// days) turn `366d` into `1year 18h`.
pub fn show(d: Duration) -> String {
    let secs = d.as_secs();
    let mut parts = Vec::new();
    for (n, unit) in [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3_600, "h"),
        (secs % 3_600 / 60, "m"),
        (secs % 60, "s"),
        (u64::from(d.subsec_millis()), "ms"),
        (u64::from(d.subsec_micros() % 1_000), "us"),
        (u64::from(d.subsec_nanos() % 1_000), "ns"),
    ] {
        if n > 0 {
            parts.push(format!("{n}{unit}"));
        }
    }
    if parts.is_empty() {
        "0s".into()
    } else {
        parts.join(" ")
    }
}

/// `d` if it is at most [`MAX`], else why not (`written`: the value as
/// the file or flag gave it).
fn bounded_as(d: Duration, written: &str) -> Result<Duration, String> {
    if d > MAX {
        Err(format!(
            "`{written}` is longer than the longest duration gpuscale takes (a year, {})",
            show(MAX)
        ))
    } else {
        Ok(d)
    }
}

/// `d` if it is at most [`MAX`], else why not.
pub fn bounded(d: Duration) -> Result<Duration, String> {
    bounded_as(d, &show(d))
}

/// Parses a flag's value (humantime's syntax), at most [`MAX`]; what is
/// not a duration is said with humantime's reason and an example.
pub fn parse(s: &str) -> Result<Duration, String> {
    // humantime's "expected number at 0" for a sign says nothing a
    // writer of `-45s` can use.
    if s.trim_start().starts_with(['-', '+']) {
        return Err(format!(
            "`{s}` is not a duration: a duration has no sign (write `45s`, not `-45s`)"
        ));
    }
    match humantime::parse_duration(s) {
        Ok(d) => bounded_as(d, s),
        // A whole number too large for humantime is longer than any
        // bound (a fraction overflows for its digits: humantime says so).
        Err(humantime::DurationError::NumberOverflow) if !s.contains('.') => Err(format!(
            "`{s}` is longer than the longest duration gpuscale takes (a year, {})",
            show(MAX)
        )),
        Err(e) => Err(format!(
            "`{s}` is not a duration ({e}): write a number and a unit, such as `30s`, `5m` or `1h 30m`"
        )),
    }
}

/// Reads a duration as text, and says plainly what else was written.
struct Text;

impl serde::de::Visitor<'_> for Text {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a duration such as `30s`, `5m` or `1h 30m`")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(E::custom)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` has no unit: write it with one, such as `{v}s` or `{v}m`"
        )))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` is not a duration: write a number and a unit, such as `30s`, `5m` or `1h 30m`"
        )))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` has no unit: write it with one, such as `{v}s` or `{v}m`"
        )))
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Duration, E> {
        Err(E::custom(format!(
            "`{v}` is not a duration: write a number and a unit, such as `30s`, `5m` or `1h 30m`"
        )))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Duration, E> {
        Err(E::custom(
            "no value given: expected a duration such as `30s`, `5m` or `1h 30m`",
        ))
    }
}

/// Serde: reads humantime's syntax, at most [`MAX`].
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(Text)
}

/// Serde: writes humantime's syntax.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    humantime_serde::serialize(d, s)
}

/// The same for `Option<Duration>`.
pub mod option {
    use super::*;

    /// Serde: reads humantime's syntax or null, at most [`MAX`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        /// The value itself, through [`Text`].
        struct Some_(Duration);
        impl<'de> Deserialize<'de> for Some_ {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(Text).map(Some_)
            }
        }
        Ok(Option::<Some_>::deserialize(d)?.map(|v| v.0))
    }

    /// Serde: writes humantime's syntax or null.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        humantime_serde::option::serialize(d, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_year_passes_and_longer_is_refused() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1year"), Ok(MAX));
        assert!(parse("366days").is_err());
        let e = parse("300000000000y").unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        assert!(parse("18446744073709551615s").is_err());
        assert!(parse("x").is_err());
        // A sign is named as such.
        let e = parse("-45s").unwrap_err();
        assert!(
            e.contains("has no sign") && !e.contains("expected number"),
            "{e}"
        );
        assert!(parse("+1m").unwrap_err().contains("has no sign"));
        // What is not a duration says why; what is too long echoes the
        // text as written.
        let e = parse("1x").unwrap_err();
        assert!(
            e.starts_with("`1x` is not a duration (") && e.contains("`30s`"),
            "{e}"
        );
        let e = parse("366d").unwrap_err();
        assert!(e.starts_with("`366d` is longer than"), "{e}");
        let e = parse("99999999999999999999999y").unwrap_err();
        assert!(e.contains("is longer than"), "{e}");
        // A fraction too fine for nanoseconds is not called long.
        let e = parse("1.5ns").unwrap_err();
        assert!(e.starts_with("`1.5ns` is not a duration ("), "{e}");
        #[derive(serde::Deserialize)]
        struct T {
            #[serde(with = "super")]
            a: Duration,
            #[serde(default, with = "super::option")]
            b: Option<Duration>,
        }
        let t: T = serde_json::from_str(r#"{"a": "5m", "b": null}"#).unwrap();
        assert_eq!((t.a, t.b), (Duration::from_secs(300), None));
        let t: T = serde_json::from_str(r#"{"a": "1s", "b": "2s"}"#).unwrap();
        assert_eq!(t.b, Some(Duration::from_secs(2)));
        let e = serde_json::from_str::<T>(r#"{"a": "1e20s"}"#);
        assert!(e.is_err());
        let e = serde_json::from_str::<T>(r#"{"a": "1s", "b": "9999999999h"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`9999999999h` is longer than"), "{e}");
        let no_unit = serde_json::from_str::<T>(r#"{"a": 30}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(no_unit.contains("`30` has no unit"), "{no_unit}");
        let null = serde_json::from_str::<T>(r#"{"a": null}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(null.contains("no value given"), "{null}");
        let b = serde_json::from_str::<T>(r#"{"a": "1s", "b": 5}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(b.contains("`5` has no unit"), "{b}");
    }

    #[test]
    fn show_writes_days_not_months_or_years() {
        let h = |s: u64| Duration::from_secs(s * 3600);
        assert_eq!(show(h(366 * 24)), "366d");
        assert_eq!(show(h(25)), "1d 1h");
        assert_eq!(show(Duration::from_secs(90)), "1m 30s");
        assert_eq!(show(Duration::from_millis(250)), "250ms");
        assert_eq!(show(Duration::from_millis(1500)), "1s 500ms");
        assert_eq!(show(Duration::ZERO), "0s");
        assert_eq!(show(Duration::from_nanos(20)), "20ns");
        assert_eq!(show(h(24) + Duration::from_nanos(1)), "1d 1ns");
        assert_eq!(show(Duration::from_nanos(1_002_003)), "1ms 2us 3ns");
        assert_eq!(show(MAX), "365d 6h");
        // What it writes reads back.
        for d in [
            h(300 * 24),
            h(25),
            Duration::from_millis(1500),
            h(24) + Duration::from_nanos(1),
            Duration::from_nanos(1_002_003),
            MAX,
        ] {
            assert_eq!(parse(&show(d)), Ok(d));
        }
    }
}
