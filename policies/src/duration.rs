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

/// `d` if it is at most [`MAX`], else why not.
pub fn bounded(d: Duration) -> Result<Duration, String> {
    if d > MAX {
        Err(format!(
            "`{}` is longer than the longest duration gpuscale takes ({})",
            humantime::format_duration(d),
            humantime::format_duration(MAX)
        ))
    } else {
        Ok(d)
    }
}

/// Parses a flag's value (humantime's syntax), at most [`MAX`].
pub fn parse(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| e.to_string())
        .and_then(bounded)
}

/// Serde: reads humantime's syntax, at most [`MAX`].
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v: Duration = humantime_serde::deserialize(d)?;
    bounded(v).map_err(serde::de::Error::custom)
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
        let v: Option<humantime_serde::Serde<Duration>> = Option::deserialize(d)?;
        v.map(|v| bounded(v.into_inner()).map_err(serde::de::Error::custom))
            .transpose()
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
        assert!(e.contains("longer than"), "{e}");
    }
}
