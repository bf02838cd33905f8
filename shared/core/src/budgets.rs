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
    /// Who is guaranteed a share of each window while they have demand, in ppm (summing to at most
    /// 1): a rule (its id), or one key of a rule (`<rule id>|<key>`, [`Budget::floor_member`]).
    /// See [`Budget::floor_units`].
    pub floors: Vec<(String, u64)>,
    /// A rule's classes calendar (docs/rules.md: "Classes under one limit"): the rule's limits,
    /// one calendar per key (its state is named [`Budget::state_name`]), floors held for classes.
    pub per_key: bool,
    /// Leased capacity (docs/rules.md, "A budget past one shard"): its keys spread over partitions,
    /// each booking against units its home leased it. `None`: one calendar, on one shard.
    pub leases: Option<Leases>,
    /// `fair: true` (docs/rules.md: "Fair budgets"): while it binds, each window's units go to
    /// the keys with events waiting, in proportion to their weights. `None`: first come, first
    /// served.
    pub fair: Option<crate::fair::Fair>,
    /// The Redis Cluster hash tag of the budget and of every entity of every rule that draws from
    /// it (the smallest budget name of the group that rules link together): one script call then
    /// touches one slot. See docs/rules.md, "Shared budgets".
    pub tag: String,
}

impl Budget {
    /// A budget of `limits` on hash tag `tag`, and nothing more: no share, level, floors,
    /// fairness or leases.
    pub fn named(name: impl Into<String>, tag: impl Into<String>, limits: Vec<Limit>) -> Self {
        Budget {
            name: name.into(),
            limits,
            max_share: None,
            adaptive: None,
            floors: Vec::new(),
            per_key: false,
            fair: None,
            leases: None,
            tag: tag.into(),
        }
    }

    /// A fair budget known only by its name and hash tag, with no limits: enough to name its
    /// keys in the store (a wake for a budget the rules no longer have).
    pub fn fair_named(name: &str, tag: &str) -> Self {
        Budget { fair: Some(Default::default()), ..Budget::named(name, tag, Vec::new()) }
    }

    /// The most one entity may take of a window of a limit whose count in force is `count`
    /// (never less than the event's cost: a share never makes an event impossible).
    pub fn share_of(&self, count: u64, cost: u64) -> Option<u64> {
        self.max_share.map(|share| scaled(count, share, cost))
    }

    /// How far ahead a fair budget books ([`crate::fair::near_horizon`] of its shortest window):
    /// an event of a rule drawing from it whose slot lies later parks. `None`: not fair.
    pub fn near(&self) -> Option<Millis> {
        let shortest = self.limits.iter().map(Limit::per).min()?;
        self.fair.as_ref().map(|_| crate::fair::near_horizon(shortest))
    }

    /// The units of a window whose count in force is `count` that each floor holds: `count × floor`,
    /// rounded down. Before its window starts, a floor's unused units are the floor's rule's
    /// alone; from its start they are anyone's (a rule with no demand then strands nothing).
    pub fn floor_units(&self, count: u64) -> impl Iterator<Item = (&str, u64)> {
        self.floors.iter().map(move |(rule, floor)| (rule.as_str(), count * floor / PPM))
    }

    /// Whose floor an event of rule `rule` (its id) and key `key` books: the key's own when the
    /// budget holds one for it (`<rule>|<key>`), else the rule's (which may hold none).
    pub fn floor_member<'a>(&'a self, rule: &'a str, key: &str) -> &'a str {
        let keyed = self.floors.iter().find(|(member, _)| member.split_once('|') == Some((rule, key)));
        keyed.map_or(rule, |(member, _)| member.as_str())
    }

    /// The name its state is kept under: its own, or for a classes calendar, `<name>|<key>`.
    pub fn state_name(&self, key: Option<&str>) -> String {
        match (self.per_key, key) {
            (true, Some(key)) => format!("{}|{key}", self.name),
            _ => self.name.clone(),
        }
    }

    /// The partition a key of a rule drawing from this budget lives in, when the budget is leased:
    /// FNV-1a (64 bits) of the key, modulo the partitions. A classed rule's key is its scope (every
    /// class of a key in one partition).
    pub fn partition_of(&self, key: &str) -> Option<u32> {
        self.leases.map(|leases| leases.partition_of(key))
    }

    /// The name a partition's pool of this budget is kept under: `<name>@<partition>`.
    pub fn pool_name(&self, partition: u32) -> String {
        format!("{}@{partition}", self.name)
    }

    /// Names one share limit inside an entity's state: `share:<budget>:<per>`.
    pub fn share_id(&self, limit: &Limit) -> String {
        format!("share:{}:{}", self.name, limit.per())
    }
}

/// One ring of a fair budget's waiting keys: the budget's, or on a leased budget one partition's.
/// A key's queue lives in its partition, so its ring and that ring's drain do too: each
/// partition's drain shares what its home leases it among its own waiting keys, and the home
/// shares each window among the partitions by what their drains ask for (docs/rules.md, "Fair
/// budgets").
#[derive(Debug, Clone, Copy)]
pub struct FairRing<'a> {
    pub budget: &'a Budget,
    pub partition: Option<u32>,
}

impl<'a> FairRing<'a> {
    /// The ring a key of a rule drawing from `budget` joins.
    pub fn of_key(budget: &'a Budget, key: &str) -> Self {
        Self { budget, partition: budget.partition_of(key) }
    }

    /// The name the model keeps it under: the budget's, or its partition's pool's.
    pub fn name(&self) -> String {
        self.partition.map_or_else(|| self.budget.name.clone(), |p| self.budget.pool_name(p))
    }
}

/// A class's key's fair share of one limit of a budget it draws from: one more limit of the key's
/// classes calendar (docs/rules.md, "Classes under one limit").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarShare {
    /// The budget's place among the event's draws, and the limit's among the budget's limits.
    pub budget: usize,
    pub limit: usize,
    pub per: Millis,
    /// Where the key's own state kept this share before the rule had classes (`Budget::share_id`).
    pub id: String,
    /// It books into its windows itself: no limit of the calendar, nor a share before it, has its
    /// period (that one counts the same events in the same windows).
    pub counts: bool,
}

/// The fair shares a classes calendar holds for its key: every limit of every budget among
/// `draws` with a `max_share`, in order.
pub fn calendar_shares(calendar: &Budget, draws: &[std::sync::Arc<Budget>]) -> Vec<CalendarShare> {
    let mut shares: Vec<CalendarShare> = Vec::new();
    for (b, budget) in draws.iter().enumerate().filter(|(_, b)| b.max_share.is_some() && !b.per_key) {
        for (l, limit) in budget.limits.iter().enumerate() {
            let per = limit.per();
            let counted = calendar.limits.iter().any(|c| c.per() == per) || shares.iter().any(|s| s.per == per);
            shares.push(CalendarShare { budget: b, limit: l, per, id: budget.share_id(limit), counts: !counted });
        }
    }
    shares
}

/// The shared budgets (not a classes calendar) an event of a rule drawing from `draws` charges,
/// by name, joined with `,`: what an entity's state remembers its reservations charged, and since
/// when (`EntityState::charges`), so that a slot reserved before its rule had a budget gives
/// nothing back to it. Empty when there are none.
pub fn charged_budgets(draws: &[std::sync::Arc<Budget>]) -> String {
    draws.iter().filter(|b| !b.per_key).map(|b| b.name.as_str()).collect::<Vec<_>>().join(",")
}

/// `leases: { partitions, chunk }`: the budget's keys spread over `partitions` partitions (each its
/// own Redis Cluster hash tag), and each partition books against a pool of units its budget's home
/// leased it, window by window. The home never leases more than a window holds, so no window is
/// ever over its limit; what a partition leased and did not use by the window's end is stranded
/// (shown as extra delay, never as excess).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Leases {
    pub partitions: u32,
    /// How much a partition asks for at once, as a fraction of the window's count (ppm): the
    /// most a partition can strand in one window (it asks again only once it used the last).
    pub chunk: u64,
}

impl Leases {
    /// The default chunk: 5 % of a window split over the partitions, so that every partition
    /// stranding a whole chunk strands 5 % of the window.
    pub fn default_chunk(partitions: u32) -> u64 {
        (PPM / 20 / u64::from(partitions.max(1))).max(1)
    }

    pub fn partition_of(&self, key: &str) -> u32 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key.as_bytes() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (hash % u64::from(self.partitions.max(1))) as u32
    }

    /// How many units of a window whose count is `count` a partition asks for to book `cost`.
    pub fn want(&self, count: u64, cost: u64) -> u64 {
        (count * self.chunk).div_ceil(PPM).max(cost)
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
    /// The downstream's latency moves the level too, before it refuses anything.
    pub latency: Option<LatencyControl>,
}

/// The adaptive level after the last signal: `level` ppm, set in window number `window`.
/// `by_latency`: a latency report set it, so a 429 in the same window still lowers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveState {
    pub level: u64,
    pub window: i64,
    pub by_latency: bool,
}

impl Adaptive {
    /// The highest level: `1 − margin`.
    pub fn ceiling(&self) -> u64 {
        PPM - self.margin
    }

    /// The level in force at `now`: the last signal's, plus a step for every whole window since
    /// the window of that signal, up to the ceiling. A level a latency report set holds instead:
    /// the next report judges whether it grows (only busy, healthy windows do); it climbs by
    /// `step` only past [`LATENCY_HOLD_WINDOWS`] windows without a report (the calls stopped).
    pub fn level(&self, state: Option<AdaptiveState>, window: Millis, now: Millis) -> u64 {
        match state {
            None => self.ceiling(),
            Some(AdaptiveState { level, window: at, by_latency }) => {
                let held = if by_latency { LATENCY_HOLD_WINDOWS } else { 0 };
                let quiet = (now.div_euclid(window) - at - 1 - held).max(0) as u64;
                level.saturating_add(quiet.saturating_mul(self.step)).min(self.ceiling())
            }
        }
    }

    /// The state after a 429, 5xx or timeout at `now`: the level multiplied by `decrease` (not
    /// below `min`), once per window; a second signal in the same window changes nothing.
    pub fn signal(&self, state: Option<AdaptiveState>, window: Millis, now: Millis) -> AdaptiveState {
        let current = now.div_euclid(window);
        match state {
            Some(state) if state.window == current && !state.by_latency => state,
            _ => {
                let level = (self.level(state, window, now) * self.decrease / PPM).max(self.min);
                AdaptiveState { level, window: current, by_latency: false }
            }
        }
    }

    /// How long a state matters: until the level is back at the ceiling, plus a window.
    pub fn memory(&self, state: AdaptiveState, window: Millis) -> Millis {
        let steps = (self.ceiling().saturating_sub(state.level)).div_ceil(self.step) as i64;
        let held = if state.by_latency { LATENCY_HOLD_WINDOWS } else { 0 };
        (held + steps + 2) * window
    }
}

/// `adaptive: { latency: { tolerance, smoothing, baseline, recover, shadow } }`: the downstream's
/// latency as the leading signal (Gradient2's gradient applied to a rate, CUBIC's climb back). Each
/// window's high percentile of call latency is compared with a baseline (the partner's latency
/// unloaded: the fastest recent window's, rising slowly); above
/// `tolerance ×` the baseline, the level is cut in proportion, and it grows back only in windows
/// whose calls use most of the count in force ([`LATENCY_BUSY`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LatencyControl {
    /// A window is slow when its percentile exceeds `tolerance ×` the baseline (ppm: 2.0 is 2_000_000).
    pub tolerance: u64,
    /// How far one slow window moves the level toward `level × gradient` (ppm).
    pub smoothing: u64,
    /// How far a slower window's percentile moves the baseline (ppm); a faster one sets it.
    pub baseline: u64,
    /// Healthy, busy windows for the level to climb back to the level that last hurt (CUBIC's K).
    pub recover: u64,
    /// Compute, log and count what the controller would do; change no level.
    pub shadow: bool,
}

// The LATENCY_* constants below reach the Lua scripts as drip-store's scripts.rs writes them
// (`shared_numbers`): change them here only.

/// Latencies under this (µs) are never slow: a gradient between sub-millisecond figures is noise.
pub const LATENCY_FLOOR_US: u64 = 1_000;

/// A percentile above this (µs, ten minutes) counts as this (the arithmetic stays exact in Lua).
pub const LATENCY_MAX_US: u64 = 600_000_000;

/// A healthy window grows the level only when its calls used this much of the count in force
/// (ppm): a level is raised only by windows that proved the partner takes it. Half, as it was
/// once, let the level climb to twice what was delivered while a backlog drained slower than the
/// level allowed, and the next burst at that level met a partner past its capacity.
pub const LATENCY_BUSY: u64 = 900_000;

/// How many windows without a report a level set by latency holds before it climbs by `step`
/// (`Adaptive::level`): between reports the level stays where the last one put it, so a window
/// too quiet to report cannot raise it past what the partner last showed it could take.
pub const LATENCY_HOLD_WINDOWS: i64 = 10;

/// How many windows a latency state is kept after its last report (its baseline is the slow part).
pub const LATENCY_MEMORY_WINDOWS: i64 = 100;

/// The climb's clock stops at this many `recover` periods (its step is steep by then; the level
/// reaches the ceiling and the climb starts over).
pub const LATENCY_MAX_CLIMB: u64 = 4;

/// What the latency controller knows of a key or budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyState {
    /// The slow average of the windows' percentiles (µs).
    pub baseline: u64,
    /// The level (ppm) in force when latency last rose past tolerance; 0 before it ever did.
    pub hurt: u64,
    /// The level right after that cut.
    pub cut: u64,
    /// Healthy, busy windows since that cut.
    pub grown: u64,
    /// The window of the report that last decided (one decides per window).
    pub window: i64,
    /// The controller's own level: in shadow mode the level it would have set, else the live one.
    pub level: u64,
}

/// One window of calls to the downstream, as a service measured them (or a consumer reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyReport {
    /// The window's high percentile (µs).
    pub percentile: u64,
    /// How many calls it was taken over.
    pub calls: u64,
}

/// What a latency report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyVerdict {
    /// Over tolerance: the level was cut by the gradient (ppm, in [0.5, 1)).
    Slow { gradient: u64 },
    /// Over tolerance, but the window's calls were more than the count in force: slots booked
    /// at a level since cut (a backlog books ahead); the level is held until the cut shows, so
    /// one overload is not cut again for every window it takes to play out.
    Lagging { gradient: u64 },
    /// Healthy and busy: the level grew.
    Grew,
    /// Healthy, but the calls used less of the count in force than [`LATENCY_BUSY`]: the level is held.
    Held,
    /// A report of this window decided already: nothing changed.
    Repeat,
}

/// A latency report's result: the live level's new state (`None`: unchanged, always in shadow
/// mode), the controller's state, and the level before and after (the would-be level in shadow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyOutcome {
    pub adaptive: Option<AdaptiveState>,
    pub latency: LatencyState,
    pub verdict: LatencyVerdict,
    pub before: u64,
    pub after: u64,
}

/// What a latency report did, as the services log and count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyChange {
    pub verdict: LatencyVerdict,
    pub before: u64,
    pub after: u64,
}

impl From<LatencyOutcome> for LatencyChange {
    fn from(outcome: LatencyOutcome) -> Self {
        Self { verdict: outcome.verdict, before: outcome.before, after: outcome.after }
    }
}

impl Adaptive {
    /// The state after `report`, received at `now`, for a target whose adaptive window is
    /// `window` and whose limit of that window counts `count` (configured, before any level).
    pub fn after_latency(
        &self,
        (adaptive, latency): (Option<AdaptiveState>, Option<LatencyState>),
        report: LatencyReport,
        (count, window): (u64, Millis),
        now: Millis,
    ) -> Option<LatencyOutcome> {
        let control = self.latency?;
        let current = now.div_euclid(window);
        let as_level = |l: LatencyState| AdaptiveState { level: l.level, window: l.window, by_latency: true };
        let before = self.level(if control.shadow { latency.map(as_level) } else { adaptive }, window, now);
        if let Some(state) = latency.filter(|l| l.window == current) {
            let verdict = LatencyVerdict::Repeat;
            return Some(LatencyOutcome { adaptive: None, latency: state, verdict, before, after: before });
        }
        let seen = report.percentile.clamp(1, LATENCY_MAX_US);
        let previous = latency.map_or(seen, |l| l.baseline);
        let gradient = (control.tolerance * previous.max(LATENCY_FLOOR_US) / seen).clamp(PPM / 2, PPM);
        let mut state = latency.unwrap_or_default();
        // The baseline is the partner's latency unloaded. A faster window proves it can answer
        // that fast: the baseline follows at once. A slower one moves it by `baseline` of the
        // way when it is healthy, and when it is slow only once the level is at its floor
        // (cutting further cannot help: the partner's latency rose for good and becomes the new
        // normal). A slow window that moved it while the level could still fall would teach the
        // controller the partner's saturated latency, and then no window is ever slow.
        let slow = gradient < PPM;
        state.baseline = if seen < previous {
            seen
        } else if slow && before > self.min {
            previous
        } else {
            previous + (seen - previous) * control.baseline / PPM
        };
        let (after, verdict) = if slow && report.calls > count * before / PPM {
            (before, LatencyVerdict::Lagging { gradient })
        } else if slow {
            let cut = (before - (before - before * gradient / PPM) * control.smoothing / PPM).max(self.min);
            (state.hurt, state.cut, state.grown) = (before, cut, 0);
            (cut, LatencyVerdict::Slow { gradient })
        } else if report.calls >= count * before / PPM * LATENCY_BUSY / PPM {
            state.grown = (state.grown + 1).min(LATENCY_MAX_CLIMB * control.recover);
            let climb = if state.hurt == 0 { self.step } else { cubic_climb(&state, self.step, control.recover) };
            let after = before.saturating_add(climb).min(self.ceiling());
            if after == self.ceiling() {
                (state.hurt, state.cut, state.grown) = (0, 0, 0);
            }
            (after, LatencyVerdict::Grew)
        } else {
            (before, LatencyVerdict::Held)
        };
        state.window = current;
        state.level = after;
        let adaptive = (!control.shadow).then_some(AdaptiveState { level: after, window: current, by_latency: true });
        Some(LatencyOutcome { adaptive, latency: state, verdict, before, after })
    }
}

/// What the `grown`th healthy, busy window after a cut adds: the step of a cubic through the cut
/// level that flattens at the level that hurt after `recover` windows, then probes above it,
/// faster and faster (CUBIC's window growth; its span is at least `step`, so a cut at the floor
/// still climbs).
fn cubic_climb(state: &LatencyState, step: u64, recover: u64) -> u64 {
    let span = (state.hurt.saturating_sub(state.cut)).max(step);
    let k = recover.max(1);
    let curve = |t: u64| -> i128 {
        let d = t as i128 - k as i128;
        span as i128 * d * d * d / (k as i128).pow(3)
    };
    (curve(state.grown) - curve(state.grown - 1)).max(0) as u64
}

/// A count scaled by parts per million (an adaptive level, a fair share), never below the event's
/// cost nor 1: what `scaled` in `lua/prelude.lua` computes.
pub fn scaled(count: u64, ppm: u64, cost: u64) -> u64 {
    (count * ppm / PPM).max(cost).max(1)
}

/// The count of `limit` in force at the adaptive `level` (ppm), from `base` (the rule's count or an
/// override): never below the event's cost, so the adaptive limit delays an event but never makes
/// it impossible. A gcra limit keeps its count: its burst tolerance is a time measured at the
/// count, so a lower count would let a burst through (docs/design.md: "Adaptive limits").
pub fn adapted_count(limit: &Limit, base: u64, level: Option<u64>, cost: u64) -> u64 {
    match (level, limit.window()) {
        (Some(level), Window::Fixed(_) | Window::Sliding) => scaled(base, level, cost),
        _ => base,
    }
}

/// The adaptive window of a set of limits: the shortest period.
pub fn adaptive_window(limits: &[Limit]) -> Millis {
    limits.iter().map(Limit::per).min().unwrap_or(1)
}

/// The count of the limit that sets the adaptive window (the shortest period; the smallest count
/// among limits of that period): what a latency report's calls are compared with.
pub fn adaptive_window_count(limits: &[Limit]) -> u64 {
    limits.iter().map(|l| (l.per(), l.limit())).min().map_or(1, |(_, count)| count)
}

/// A fraction in [0, 1] from the rules file, in ppm.
pub fn fraction_ppm(value: f64) -> Option<u64> {
    (value.is_finite() && (0.0..=1.0).contains(&value)).then(|| (value * PPM as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AIMD: Adaptive = Adaptive { margin: 100_000, decrease: 500_000, min: 200_000, step: 100_000, latency: None };

    #[test]
    fn a_signal_multiplies_once_per_window_and_quiet_windows_climb_back() {
        assert_eq!(AIMD.level(None, 1_000, 0), 900_000);
        let first = AIMD.signal(None, 1_000, 5_100);
        assert_eq!(first, AdaptiveState { level: 450_000, window: 5, by_latency: false });
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

    const CONTROL: LatencyControl =
        LatencyControl { tolerance: 2_000_000, smoothing: 500_000, baseline: 50_000, recover: 4, shadow: false };

    fn report(ms: u64, calls: u64) -> LatencyReport {
        LatencyReport { percentile: ms * 1_000, calls }
    }

    #[test]
    fn latency_past_tolerance_cuts_in_proportion_and_a_busy_healthy_window_climbs_back_cubically() {
        let aimd = Adaptive { latency: Some(CONTROL), ..AIMD };
        let count_window = (100, 1_000);
        let first = aimd.after_latency((None, None), report(80, 90), count_window, 10_000).unwrap();
        assert_eq!(first.latency.baseline, 80_000, "the first report is the baseline");
        assert_eq!((first.verdict, first.after), (LatencyVerdict::Grew, 900_000), "at the ceiling already");
        let again = aimd.after_latency((first.adaptive, Some(first.latency)), report(900, 90), count_window, 10_500);
        assert_eq!(again.unwrap().verdict, LatencyVerdict::Repeat, "one report decides per window");
        // p99 at 4× the baseline: gradient 2×80/320 = 0.5, half of the way there (smoothing 0.5).
        let slow =
            aimd.after_latency((first.adaptive, Some(first.latency)), report(320, 90), count_window, 11_000).unwrap();
        assert_eq!(slow.verdict, LatencyVerdict::Slow { gradient: 500_000 });
        assert_eq!((slow.before, slow.after), (900_000, 675_000));
        assert_eq!(slow.latency.baseline, 80_000, "a slow window leaves the baseline while the level can fall");
        assert_eq!((slow.latency.hurt, slow.latency.cut), (900_000, 675_000));
        let signalled = aimd.signal(slow.adaptive, 1_000, 11_500);
        assert_eq!(signalled.level, 337_500, "a 429 in the window a latency report decided still lowers the level");
        // Healthy but app-limited: 30 calls against 67 in force: held.
        let held =
            aimd.after_latency((slow.adaptive, Some(slow.latency)), report(80, 30), count_window, 12_000).unwrap();
        assert_eq!((held.verdict, held.after), (LatencyVerdict::Held, 675_000));
        assert_eq!(held.latency.baseline, 80_000, "a faster window sets the baseline at once");
        // Busy: the cubic climbs steeply first, flattens at the level that hurt after `recover`.
        let mut state = (held.adaptive, Some(held.latency));
        let mut levels = Vec::new();
        for w in 13..=20 {
            let next = aimd.after_latency(state, report(80, 90), count_window, w * 1_000).unwrap();
            levels.push(next.after);
            state = (next.adaptive, Some(next.latency));
        }
        // span 225_000 over K = 4: the curve 225000·(t−4)³/64 (truncated) at t = 0, 1, 2, 3, 4 is
        // −225000, −94921, −28125, −3515, 0: its steps are the climbs.
        assert_eq!(levels[..4], [805_079, 871_875, 896_485, 900_000][..]);
        assert_eq!(levels[4..], [900_000; 4][..], "the ceiling, not above");
        assert_eq!(state.1.unwrap().hurt, 0, "at the ceiling the climb starts over");
    }

    #[test]
    fn a_slow_window_of_calls_booked_before_the_cut_is_not_cut_again() {
        let aimd = Adaptive { latency: Some(CONTROL), ..AIMD };
        let first = aimd.after_latency((None, None), report(80, 90), (100, 1_000), 10_000).unwrap();
        let slow = aimd.after_latency((first.adaptive, Some(first.latency)), report(320, 90), (100, 1_000), 11_000);
        let slow = slow.unwrap();
        assert_eq!(slow.after, 675_000);
        // 80 calls against 67 in force: they were booked at the level before the cut.
        let lagging =
            aimd.after_latency((slow.adaptive, Some(slow.latency)), report(320, 80), (100, 1_000), 12_000).unwrap();
        assert_eq!(lagging.verdict, LatencyVerdict::Lagging { gradient: 500_000 });
        assert_eq!((lagging.before, lagging.after), (675_000, 675_000), "held");
        assert_eq!((lagging.latency.hurt, lagging.latency.cut), (900_000, 675_000), "the same episode");
        // 67 calls, the count in force, still slow: the cut showed and did not suffice.
        let again = aimd
            .after_latency((lagging.adaptive, Some(lagging.latency)), report(320, 67), (100, 1_000), 13_000)
            .unwrap();
        assert_eq!((again.verdict, again.after), (LatencyVerdict::Slow { gradient: 500_000 }, 506_250));
    }

    #[test]
    fn the_baseline_follows_a_faster_window_at_once_and_a_slower_one_only_healthy_or_at_the_floor() {
        let aimd = Adaptive { latency: Some(CONTROL), ..AIMD };
        // A first window measured while the partner was saturated: 400 ms.
        let first = aimd.after_latency((None, None), report(400, 90), (100, 1_000), 10_000).unwrap();
        let fast = aimd.after_latency((first.adaptive, Some(first.latency)), report(40, 90), (100, 1_000), 11_000);
        assert_eq!(fast.unwrap().latency.baseline, 40_000, "at once");
        let fast = fast.unwrap();
        let healthy = aimd.after_latency((fast.adaptive, Some(fast.latency)), report(60, 90), (100, 1_000), 12_000);
        assert_eq!(healthy.unwrap().latency.baseline, 41_000, "a twentieth of the way up");
        // The partner's latency rose for good: cut after cut to the floor, then the baseline moves.
        let mut state = (fast.adaptive, Some(fast.latency));
        let mut baselines = Vec::new();
        for w in 12..20 {
            let next = aimd.after_latency(state, report(400, 10), (100, 1_000), w * 1_000).unwrap();
            baselines.push((next.before, next.latency.baseline));
            state = (next.adaptive, Some(next.latency));
        }
        let at_floor = baselines.iter().position(|&(before, _)| before == AIMD.min).unwrap();
        assert!(at_floor > 0 && baselines[..at_floor].iter().all(|&(_, b)| b == 40_000), "{baselines:?}");
        assert_eq!(baselines[at_floor].1, 40_000 + 360_000 / 20, "{baselines:?}");
    }

    #[test]
    fn only_a_window_that_used_most_of_the_count_in_force_grows_the_level() {
        let aimd = Adaptive { latency: Some(CONTROL), ..AIMD };
        let at = AdaptiveState { level: 500_000, window: 9, by_latency: true };
        let first = aimd.after_latency((Some(at), None), report(40, 50), (100, 1_000), 10_000).unwrap();
        let grew = |calls| {
            let next =
                aimd.after_latency((first.adaptive, Some(first.latency)), report(40, calls), (100, 1_000), 11_000);
            next.unwrap().verdict
        };
        assert_eq!(first.verdict, LatencyVerdict::Grew);
        // 60 in force after the first climb: 54 calls (nine tenths) grow it, 53 hold it.
        assert_eq!((grew(54), grew(53)), (LatencyVerdict::Grew, LatencyVerdict::Held));
    }

    #[test]
    fn a_level_set_by_latency_holds_between_reports_and_climbs_only_once_the_reports_stop() {
        let aimd = Adaptive { latency: Some(CONTROL), ..AIMD };
        let first = aimd.after_latency((None, None), report(80, 90), (100, 1_000), 10_000).unwrap();
        let slow = aimd.after_latency((first.adaptive, Some(first.latency)), report(320, 90), (100, 1_000), 11_000);
        let cut = slow.unwrap().adaptive.unwrap();
        assert_eq!((cut.level, cut.by_latency), (675_000, true));
        let quiet_through = 11 + LATENCY_HOLD_WINDOWS;
        assert_eq!(aimd.level(Some(cut), 1_000, 13_000), 675_000, "a window without a report does not raise it");
        assert_eq!(aimd.level(Some(cut), 1_000, quiet_through * 1_000 + 999), 675_000, "held as long as that");
        assert_eq!(aimd.level(Some(cut), 1_000, (quiet_through + 2) * 1_000), 775_000, "then a step per window");
        let by_429 = AdaptiveState { by_latency: false, ..cut };
        assert_eq!(aimd.level(Some(by_429), 1_000, 13_000), 775_000, "a 429's level climbs at once, as AIMD's");
        let memory = aimd.memory(cut, 1_000) - aimd.memory(by_429, 1_000);
        assert_eq!(memory, LATENCY_HOLD_WINDOWS * 1_000, "the held level is kept as much longer");
    }

    #[test]
    fn a_shadow_controller_keeps_its_own_level_and_changes_none() {
        let shadow = Adaptive { latency: Some(LatencyControl { shadow: true, ..CONTROL }), ..AIMD };
        let first = shadow.after_latency((None, None), report(50, 90), (100, 1_000), 0).unwrap();
        let slow = shadow.after_latency((None, Some(first.latency)), report(400, 90), (100, 1_000), 1_000).unwrap();
        assert_eq!(slow.adaptive, None, "the live level is untouched");
        assert_eq!((slow.after, slow.latency.level), (675_000, 675_000));
        let next = shadow.after_latency((None, Some(slow.latency)), report(400, 90), (100, 1_000), 2_000).unwrap();
        assert_eq!(next.before, 675_000, "the next report starts from the would-be level");
        assert_eq!(AIMD.after_latency((None, None), report(50, 90), (100, 1_000), 0), None, "no latency control");
    }
}
