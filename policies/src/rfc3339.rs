//! RFC 3339 timestamps as Kubernetes writes them (`creationTimestamp`,
//! `startTime`): a date, a time and a zone, `Z` or an offset
//! (`2026-12-03T09:00:00Z`, `2026-12-03T10:00:00+01:00`), parsed by jiff
//! (k8s-openapi's own time type). A time without a zone is refused: it
//! names no instant, and reading it as UTC would shift a job by the
//! writer's offset without a word.

use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;

/// Parses an RFC 3339 timestamp with its zone.
pub fn parse(text: &str) -> Result<SystemTime, String> {
    let refused = || {
        format!(
            "`{}` is not an RFC 3339 time with a zone: write e.g. 2026-12-03T09:00:00Z or \
             2026-12-03T10:00:00+01:00",
            crate::model::shown(text)
        )
    };
    // RFC 3339's `time-numoffset` has an hour of 00–23; jiff reads up to
    // ±25:59, which Kubernetes' own parser (Go's) would not take.
    let trimmed = text.trim();
    if let Some(t) = trimmed.find(['T', 't', ' '])
        && let Some(sign) = trimmed[t..].rfind(['+', '-'])
        && let Some(hour) = trimmed[t + sign + 1..].get(..2)
        && hour.parse::<u32>().is_ok_and(|h| h > 23)
    {
        return Err(format!(
            "`{}` has a zone offset of {hour} hours; RFC 3339 offsets run from -23:59 to +23:59",
            crate::model::shown(text)
        ));
    }
    let t: Timestamp = trimmed.parse().map_err(|_| refused())?;
    let secs = t.as_second();
    let nanos = u32::try_from(t.subsec_nanosecond()).unwrap_or(0);
    // Before 1970 (jiff's subsecond part has the sign of the seconds).
    let at = if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs.unsigned_abs(), nanos))
    } else {
        let back = Duration::new(secs.unsigned_abs(), 0)
            + Duration::from_nanos(u64::from(t.subsec_nanosecond().unsigned_abs()));
        SystemTime::UNIX_EPOCH.checked_sub(back)
    };
    at.ok_or_else(refused)
}

/// `#[serde(with = "crate::rfc3339::option")]` for `Option<SystemTime>`:
/// read by [`parse`], written in UTC (`…Z`).
pub mod option {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the time as RFC 3339 in UTC.
    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&humantime::format_rfc3339(*t).to_string()),
            None => s.serialize_none(),
        }
    }

    /// Reads an RFC 3339 time with its zone.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => super::parse(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::{Duration, SystemTime};

    // The instant by hand: 1970–2025 are 56 years with 14 leap days
    // (1972, …, 2024), 20,454 days; January to November 2026 334 more,
    // and 2 to the 3rd: 20,790 days, 1,796,256,000 s; then 9 h.
    const NINE_UTC: u64 = 20_790 * 86_400 + 9 * 3600;

    #[test]
    fn zones_and_offsets_name_the_same_instant() {
        let at = |s| {
            parse(s)
                .unwrap()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
        };
        assert_eq!(at("2026-12-03T09:00:00Z"), Duration::from_secs(NINE_UTC));
        assert_eq!(
            at("2026-12-03T10:00:00+01:00"),
            Duration::from_secs(NINE_UTC)
        );
        assert_eq!(
            at("2026-12-03T04:30:00-04:30"),
            Duration::from_secs(NINE_UTC)
        );
        assert_eq!(
            at("2026-12-03T09:00:00.25Z"),
            Duration::from_millis(NINE_UTC * 1000 + 250)
        );
    }

    #[test]
    fn an_offset_beyond_rfc_3339_s_hours_is_refused() {
        assert!(parse("2026-12-03T09:00:00+23:59").is_ok());
        for bad in ["2026-12-03T09:00:00+25:00", "2026-12-03T09:00:00-24:00"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("zone offset of"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_time_without_a_zone_or_not_a_time_is_refused() {
        for bad in ["2026-12-03T09:00:00", "2026-12-03", "yesterday", ""] {
            let e = parse(bad).unwrap_err();
            assert!(
                e.contains("is not an RFC 3339 time with a zone"),
                "{bad}: {e}"
            );
        }
    }
}
