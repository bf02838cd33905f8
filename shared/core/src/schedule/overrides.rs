//! A limit's identity and its count in force: the ids its windows and GCRA state are kept under,
//! and per-key overrides (`drip limits set`) with their ends.

use super::*;

/// The state of one limit of one entity. Its size never depends on the backlog: two numbers for
/// fixed and gcra, and for sliding only the slots inside the last `per` (equal times merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitState {
    /// The window of the latest reservation and the cost reserved in it.
    Fixed { window: Millis, used: u64 },
    /// The theoretical arrival time, `tat + tat_rem / limit` milliseconds, kept exact.
    Gcra { tat: Millis, tat_rem: u64 },
    /// Reserved slots with the running total of cost up to and including each; `base` is the
    /// running total of the slots already dropped.
    Sliding { base: u64, entries: VecDeque<(Millis, u64)> },
}

/// A per-entity limit set at run time (`drip limits set`): `limit` replaces the rule's count for
/// that limit until `until` (none: until deleted). The limit's state is kept across the change:
/// fixed and sliding usage counts against the new count; gcra's remainder is read in units of the
/// count in force (a change moves its theoretical arrival time by less than a millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub limit: u64,
    pub until: Option<Millis>,
}

impl LimitOverride {
    pub fn in_force(&self, now: Millis) -> bool {
        self.until.is_none_or(|until| now < until)
    }

    /// The override that sets `count`, replacing `current` at `now`: ending at `until` (refused
    /// when already past: it would never be in force), else without an end when `forever`, else
    /// when `current` ends, so a new count never silently makes a temporary override permanent.
    pub fn replacing(
        current: Option<LimitOverride>,
        count: u64,
        (until, forever): (Option<Millis>, bool),
        now: Millis,
    ) -> Result<Self, String> {
        let until = match (until, forever) {
            (Some(_), true) => return Err("give an end or forever, not both".into()),
            (Some(until), false) if until <= now => {
                return Err(format!(
                    "the end {} is in the past: the override would never be in force",
                    crate::time::format_rfc3339(until)
                ));
            }
            (Some(until), false) => Some(until),
            (None, true) => None,
            (None, false) => current.and_then(|c| c.until).filter(|&until| until > now),
        };
        Ok(Self { limit: count, until })
    }
}

/// Names a limit of a rule for overrides: its kind and period (`fixed:60000`), unique within a
/// rule, and the same whatever its count.
pub fn override_id(limit: &Limit) -> String {
    format!("{}:{}", limit.window().kind(), limit.per())
}

/// The count of `limit` in force at `now` for an entity with these overrides.
pub fn effective_limit(limit: &Limit, overrides: &BTreeMap<String, LimitOverride>, now: Millis) -> u64 {
    match overrides.get(&override_id(limit)) {
        Some(o) if o.in_force(now) => o.limit,
        _ => limit.limit(),
    }
}

/// Names a limit's state inside its entity (also the Redis hash field and sliding key suffix).
/// A changed `limit` keeps fixed and sliding usage; gcra's exact arithmetic depends on it.
pub fn state_id(limit: &Limit) -> String {
    match limit.window() {
        Window::Fixed(_) => format!("fixed:{}", limit.per()),
        Window::Sliding => format!("sliding:{}", limit.per()),
        Window::Gcra { .. } => format!("gcra:{}:{}", limit.per(), limit.limit()),
    }
}

#[cfg(test)]
mod override_tests {
    use super::LimitOverride;

    #[test]
    fn a_new_count_keeps_the_end_unless_told_otherwise_and_never_ends_in_the_past() {
        let temporary = Some(LimitOverride { limit: 5, until: Some(1_000) });
        let replace = |current, until, forever| LimitOverride::replacing(current, 9, (until, forever), 100);
        assert_eq!(replace(temporary, None, false), Ok(LimitOverride { limit: 9, until: Some(1_000) }));
        assert_eq!(replace(temporary, None, true), Ok(LimitOverride { limit: 9, until: None }));
        assert_eq!(replace(temporary, Some(2_000), false), Ok(LimitOverride { limit: 9, until: Some(2_000) }));
        assert_eq!(replace(None, None, false), Ok(LimitOverride { limit: 9, until: None }));
        let ended = Some(LimitOverride { limit: 5, until: Some(50) });
        assert_eq!(
            replace(ended, None, false),
            Ok(LimitOverride { limit: 9, until: None }),
            "an ended one's end is gone"
        );
        assert!(replace(temporary, Some(100), false).unwrap_err().contains("in the past"));
        assert!(replace(temporary, Some(2_000), true).is_err());
    }
}
