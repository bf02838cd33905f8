//! Shared budgets (limits that many entities and rules draw from together) and adaptive limits
//! (a count that follows the downstream's 429s, 5xx and timeouts: AIMD). The arithmetic here is
//! integer only (fractions in parts per million), so `lua/reserve.lua` can repeat it exactly.

use crate::limit::{Limit, Window};
use crate::time::Millis;

/// Fractions (`max_share`, the adaptive parameters) are kept in parts per million.
pub const PPM: u64 = 1_000_000;

/// A top-level `budgets:` entry: limits shared by every entity of every rule that lists it.
/// Its limits are fixed windows: slots from many entities arrive out of order, and only a
/// per-window count can take a reservation before one already made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    pub limits: Vec<Limit>,
    /// The most one entity may take of each window of each limit, in ppm (fair share).
    pub max_share: Option<u64>,
    pub adaptive: Option<Adaptive>,
    /// The Redis Cluster hash tag of the budget and of every entity of every rule that draws from
    /// it (the smallest budget name of the group that rules link together): one script call then
    /// touches one slot. See docs/rules.md, "Shared budgets".
    pub tag: String,
}

impl Budget {
    /// The most one entity may take of a window of a limit whose count in force is `count`
    /// (never less than the event's cost: a share never makes an event impossible).
    pub fn share_of(&self, count: u64, cost: u64) -> Option<u64> {
        self.max_share.map(|share| (count * share / PPM).max(cost).max(1))
    }

    /// Names one share limit inside an entity's state: `share:<budget>:<per>`.
    pub fn share_id(&self, limit: &Limit) -> String {
        format!("share:{}:{}", self.name, limit.per())
    }
}

/// Where a rule's downstream feedback (a 429, a 5xx, a timeout, a `Retry-After`) goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FeedbackTarget {
    /// The event's entity (rule, key): the default.
    #[default]
    Key,
    /// A budget the rule draws from: the downstream is shared, so is its answer.
    Budget(String),
}

/// `adaptive: { margin, decrease, min, step }`, each a fraction in ppm. The count in force is
/// `configured × level`, where `level` starts at `1 − margin`, is multiplied by `decrease` (not
/// below `min`) at most once per window with a 429, 5xx or timeout, and climbs by `step` per
/// window without one, back to `1 − margin`. A window is the shortest period of the limits adapted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Adaptive {
    pub margin: u64,
    pub decrease: u64,
    pub min: u64,
    pub step: u64,
}

/// The adaptive level after the last signal: `level` ppm, set in window number `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveState {
    pub level: u64,
    pub window: i64,
}

impl Adaptive {
    /// The highest level: `1 − margin`.
    pub fn ceiling(&self) -> u64 {
        PPM - self.margin
    }

    /// The level in force at `now`: the last signal's, plus a step for every whole window since
    /// the window of that signal, up to the ceiling.
    pub fn level(&self, state: Option<AdaptiveState>, window: Millis, now: Millis) -> u64 {
        match state {
            None => self.ceiling(),
            Some(AdaptiveState { level, window: at }) => {
                let quiet = (now.div_euclid(window) - at - 1).max(0) as u64;
                level.saturating_add(quiet.saturating_mul(self.step)).min(self.ceiling())
            }
        }
    }

    /// The state after a 429, 5xx or timeout at `now`: the level multiplied by `decrease` (not
    /// below `min`), once per window; a second signal in the same window changes nothing.
    pub fn signal(&self, state: Option<AdaptiveState>, window: Millis, now: Millis) -> AdaptiveState {
        let current = now.div_euclid(window);
        match state {
            Some(state) if state.window == current => state,
            _ => {
                let level = (self.level(state, window, now) * self.decrease / PPM).max(self.min);
                AdaptiveState { level, window: current }
            }
        }
    }

    /// How long a state matters: until the level is back at the ceiling, plus a window.
    pub fn memory(&self, state: AdaptiveState, window: Millis) -> Millis {
        let steps = (self.ceiling().saturating_sub(state.level)).div_ceil(self.step) as i64;
        (steps + 2) * window
    }
}

/// The count of `limit` in force at the adaptive `level` (ppm), from `base` (the rule's count or an
/// override): never below the event's cost, so the adaptive limit delays an event but never makes
/// it impossible. A gcra limit keeps its count: its burst tolerance is a time measured at the
/// count, so a lower count would let a burst through (docs/design.md: "Adaptive limits").
pub fn adapted_count(limit: &Limit, base: u64, level: Option<u64>, cost: u64) -> u64 {
    match (level, limit.window()) {
        (Some(level), Window::Fixed(_) | Window::Sliding) => (base * level / PPM).max(cost).max(1),
        _ => base,
    }
}

/// The adaptive window of a set of limits: the shortest period.
pub fn adaptive_window(limits: &[Limit]) -> Millis {
    limits.iter().map(Limit::per).min().unwrap_or(1)
}

/// A fraction in [0, 1] from the rules file, in ppm.
pub fn fraction_ppm(value: f64) -> Option<u64> {
    (value.is_finite() && (0.0..=1.0).contains(&value)).then(|| (value * PPM as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AIMD: Adaptive = Adaptive { margin: 100_000, decrease: 500_000, min: 200_000, step: 100_000 };

    #[test]
    fn a_signal_multiplies_once_per_window_and_quiet_windows_climb_back() {
        assert_eq!(AIMD.level(None, 1_000, 0), 900_000);
        let first = AIMD.signal(None, 1_000, 5_100);
        assert_eq!(first, AdaptiveState { level: 450_000, window: 5 });
        assert_eq!(AIMD.signal(Some(first), 1_000, 5_900), first, "one decrease per window");
        let second = AIMD.signal(Some(first), 1_000, 6_000);
        assert_eq!(second.level, 225_000);
        assert_eq!(AIMD.signal(Some(second), 1_000, 7_000).level, 200_000, "not below min");
        assert_eq!(AIMD.level(Some(second), 1_000, 6_999), 225_000, "the signal's own window");
        assert_eq!(AIMD.level(Some(second), 1_000, 7_000), 225_000, "window 7 has not passed yet");
        assert_eq!(AIMD.level(Some(second), 1_000, 8_000), 325_000, "window 7 passed quietly");
        assert_eq!(AIMD.level(Some(second), 1_000, 60_000), 900_000, "back to the ceiling, not above");
        let fixed = Limit::new(100, 1_000, Window::Fixed(crate::limit::Placement::Start)).unwrap();
        assert_eq!(adapted_count(&fixed, 100, Some(225_000), 1), 22);
        assert_eq!(adapted_count(&fixed, 100, Some(225_000), 30), 30, "never below the cost");
        assert_eq!(adapted_count(&fixed, 100, None, 1), 100, "no adaptive limit");
        let gcra = Limit::new(100, 1_000, Window::Gcra { burst: 5 }).unwrap();
        assert_eq!(adapted_count(&gcra, 100, Some(225_000), 1), 100, "a gcra limit keeps its count");
    }
}
