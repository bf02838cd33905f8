//! Time as integer milliseconds since the Unix epoch, the unit of every slot.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (or a duration in milliseconds).
pub type Millis = i64;

pub const SECOND: Millis = 1_000;
pub const MINUTE: Millis = 60 * SECOND;
pub const HOUR: Millis = 60 * MINUTE;
pub const DAY: Millis = 24 * HOUR;

/// Parses `90s`, `1m`, `2h`, `1d`, `500ms`, `1h30m`. Errors say why in words fit for a config error.
pub fn parse_duration(text: &str) -> Result<Millis, String> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|e| format!("invalid duration '{text}' ({e}); use e.g. 500ms, 1s, 90s, 1m, 2h, 1d"))?;
    if duration.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("invalid duration '{text}': finer than a millisecond"));
    }
    Millis::try_from(duration.as_millis()).map_err(|_| format!("invalid duration '{text}': too long"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_of_the_rule_format() {
        assert_eq!(parse_duration("1s"), Ok(SECOND));
        assert_eq!(parse_duration("1m"), Ok(MINUTE));
        assert_eq!(parse_duration("90s"), Ok(90 * SECOND));
        assert_eq!(parse_duration("2h"), Ok(2 * HOUR));
        assert_eq!(parse_duration("1d"), Ok(DAY));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert!(parse_duration("1x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn timestamps_round_trip_at_millisecond_precision() {
        let at = parse_rfc3339("2026-08-03T12:00:01.123456Z").unwrap();
        assert_eq!(format_rfc3339(at), "2026-08-03T12:00:01.123Z");
        assert_eq!(parse_rfc3339("2026-08-03T12:00:00Z").unwrap() % MINUTE, 0);
    }
}
