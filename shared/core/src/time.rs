//! Time as integer milliseconds since the Unix epoch, the unit of every slot.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (or a duration in milliseconds).
pub type Millis = i64;

pub const SECOND: Millis = 1_000;
pub const MINUTE: Millis = 60 * SECOND;
pub const HOUR: Millis = 60 * MINUTE;
pub const DAY: Millis = 24 * HOUR;

/// The units a duration may use: each is a fixed length whose windows (aligned to the Unix epoch)
/// start where a reader expects them to. Weeks, months and years are refused: a week window would
/// start on Thursdays (1970-01-01 was one), and months and years have no fixed length.
const UNITS: [(&str, Millis); 5] = [("ms", 1), ("s", SECOND), ("m", MINUTE), ("h", HOUR), ("d", DAY)];

/// Parses `90s`, `1m`, `2h`, `1d`, `500ms`, `1h30m`: whole numbers, each with one of the units
/// `ms`, `s`, `m`, `h`, `d`. Errors say why in words fit for a config error, and for a unit a person
/// could misread (`1M`, `1mo`, `1w`, `1y`, `0.5s`) what it would have meant.
pub fn parse_duration(text: &str) -> Result<Millis, String> {
    let invalid = |why: String| format!("invalid duration '{text}': {why}; use e.g. 500ms, 1s, 90s, 1m, 2h, 1d");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    let mut total: Millis = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(invalid(format!("expected a number at '{rest}'")));
        }
        let (number, after) = rest.split_at(digits);
        if after.starts_with('.') {
            return Err(invalid("fractions are not accepted (0.5s would be 500ms: write that)".into()));
        }
        let after = after.trim_start();
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let Some(&(_, length)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(invalid(misread_unit(unit)));
        };
        let number: Millis = number.parse().map_err(|_| invalid("too long".into()))?;
        total = number
            .checked_mul(length)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| invalid("too long".into()))?;
        rest = after.trim_start();
    }
    Ok(total)
}

/// A span in the rules file's own spelling, as `parse_duration` reads it back: `1d`, `90s` as
/// `1m30s`, `500ms`, `0s`. What `10000 per 1d` says in every message Drip prints.
pub fn format_duration(span: Millis) -> String {
    if span == 0 {
        return "0s".into();
    }
    let mut rest = span.unsigned_abs();
    let mut out = if span < 0 { "-".to_owned() } else { String::new() };
    for &(name, length) in UNITS.iter().rev() {
        let length = length as u64;
        if rest >= length {
            out += &format!("{}{name}", rest / length);
            rest %= length;
        }
    }
    out
}

/// Why `unit` is refused, saying what it would have meant where a person could misread it.
fn misread_unit(unit: &str) -> String {
    match unit {
        "" => "a number needs a unit (ms, s, m, h or d)".into(),
        "M" | "mo" | "mon" | "month" | "months" => format!(
            "'{unit}' would be a month of 30.44 days in windows aligned to 1970, not a calendar month; write days (30d) if a fixed length is meant"
        ),
        "y" | "yr" | "year" | "years" => format!(
            "'{unit}' would be a year of 365.25 days in windows aligned to 1970, not a calendar year; write days (365d) if a fixed length is meant"
        ),
        "w" | "week" | "weeks" => format!(
            "'{unit}' would be a week whose windows start on Thursdays (1970-01-01 was one); write 7d if that is meant"
        ),
        "us" | "µs" | "ns" => format!("'{unit}' is finer than a millisecond, the unit of every slot"),
        _ => format!("unknown unit '{unit}' (accepted: ms, s, m, h, d)"),
    }
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-08-03T12:01:00.000Z`.
pub fn format_rfc3339(at: Millis) -> String {
    let at = u64::try_from(at).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at)).to_string()
}

/// Parses RFC 3339 (UTC `Z`, any fraction), truncating to the millisecond.
pub fn parse_rfc3339(text: &str) -> Result<Millis, String> {
    let at = humantime::parse_rfc3339(text).map_err(|e| format!("invalid timestamp '{text}': {e}"))?;
    system_time_to_millis(at).ok_or_else(|| format!("invalid timestamp '{text}': before 1970"))
}

/// The local wall clock, for the edges (the dispatcher's lateness, the simulator's default `now`).
/// Nothing in the reference model calls it: the model is given `now`.
pub fn wall_clock_millis() -> Millis {
    system_time_to_millis(SystemTime::now()).unwrap_or(0)
}

pub fn system_time_to_millis(at: SystemTime) -> Option<Millis> {
    let since = at.duration_since(UNIX_EPOCH).ok()?;
    Millis::try_from(since.as_millis()).ok()
}

/// Serde for a time in a JSON answer or audit entry: written as RFC 3339; read from RFC 3339 or
/// from milliseconds since the epoch (how entries written by earlier versions hold it).
/// `#[serde(with = "drip_core::time::rfc3339")]`, or `rfc3339::option` for an `Option<Millis>`.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::{Millis, format_rfc3339, parse_rfc3339};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Millis(Millis),
    }

    impl Written {
        fn millis<E: serde::de::Error>(self) -> Result<Millis, E> {
            match self {
                Written::Text(text) => parse_rfc3339(&text).map_err(E::custom),
                Written::Millis(millis) => Ok(millis),
            }
        }
    }

    pub fn serialize<S: Serializer>(at: &Millis, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_rfc3339(*at))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Millis, D::Error> {
        Written::deserialize(deserializer)?.millis()
    }

    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        use super::Written;
        use crate::time::{Millis, format_rfc3339};

        pub fn serialize<S: Serializer>(at: &Option<Millis>, serializer: S) -> Result<S::Ok, S::Error> {
            match at {
                Some(at) => serializer.serialize_str(&format_rfc3339(*at)),
                None => serializer.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Millis>, D::Error> {
            Option::<Written>::deserialize(deserializer)?.map(Written::millis).transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_span_is_written_as_the_rules_file_writes_it_and_reads_back() {
        for (span, text) in
            [(DAY, "1d"), (90 * SECOND, "1m30s"), (500, "500ms"), (0, "0s"), (DAY + HOUR + 5, "1d1h5ms")]
        {
            assert_eq!(super::format_duration(span), text);
            assert_eq!(super::parse_duration(text), Ok(span));
        }
    }

    use super::*;

    #[test]
    fn durations_of_the_rule_format() {
        assert_eq!(parse_duration("1s"), Ok(SECOND));
        assert_eq!(parse_duration("1m"), Ok(MINUTE));
        assert_eq!(parse_duration("90s"), Ok(90 * SECOND));
        assert_eq!(parse_duration("2h"), Ok(2 * HOUR));
        assert_eq!(parse_duration("1d"), Ok(DAY));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert_eq!(parse_duration("1h30m"), Ok(90 * MINUTE));
        assert_eq!(parse_duration(" 1h 30m "), Ok(90 * MINUTE));
        assert!(parse_duration("1x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999d").unwrap_err().contains("too long"));
    }

    #[test]
    fn units_a_person_could_misread_are_refused_with_what_they_would_mean() {
        for (text, says) in [
            ("1M", "month of 30.44 days"),
            ("1mo", "month of 30.44 days"),
            ("1 month", "month of 30.44 days"),
            ("1y", "year of 365.25 days"),
            ("1w", "start on Thursdays"),
            ("0.5s", "500ms"),
            ("1.5h", "fractions"),
            ("10", "needs a unit"),
            ("5us", "finer than a millisecond"),
            ("1min", "unknown unit 'min'"),
        ] {
            let error = parse_duration(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.contains(&format!("'{text}'")), "{text}: {error}");
        }
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Stamped {
        #[serde(with = "super::rfc3339")]
        at: Millis,
        #[serde(default, with = "super::rfc3339::option")]
        until: Option<Millis>,
    }

    #[test]
    fn json_times_are_written_as_rfc3339_and_read_from_either_form() {
        let at = parse_rfc3339("2026-08-03T12:00:01.123Z").unwrap();
        let written = serde_json::to_value(Stamped { at, until: None }).unwrap();
        assert_eq!(written, serde_json::json!({"at": "2026-08-03T12:00:01.123Z", "until": null}));
        let old: Stamped = serde_json::from_value(serde_json::json!({"at": at, "until": at + 1})).unwrap();
        assert_eq!(old, Stamped { at, until: Some(at + 1) });
        let new: Stamped = serde_json::from_value(serde_json::json!({"at": "2026-08-03T12:00:01.123Z"})).unwrap();
        assert_eq!(new, Stamped { at, until: None });
        assert!(serde_json::from_value::<Stamped>(serde_json::json!({"at": "yesterday"})).is_err());
    }

    #[test]
    fn timestamps_round_trip_at_millisecond_precision() {
        let at = parse_rfc3339("2026-08-03T12:00:01.123456Z").unwrap();
        assert_eq!(format_rfc3339(at), "2026-08-03T12:00:01.123Z");
        assert_eq!(parse_rfc3339("2026-08-03T12:00:00Z").unwrap() % MINUTE, 0);
    }
}
