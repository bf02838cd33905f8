//! Random arrival sequences for one rule over a few entities, and the invariants every schedule
//! must satisfy (docs/design.md: "Scheduling semantics"), checked against the schedule alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use drip_core::budgets::{Adaptive, Budget, PPM};
use drip_core::ledger::{fixed_window_usage, gcra_violation, max_sliding_usage};
use drip_core::rules::{Classes, Limit, Placement, Rule, RuleSet, Window};
use drip_core::schedule::ANSWER_MINUTE;
use drip_core::schedule::{LimitOverride, OldSlot, Reservation, Status, override_id, state_id};
use drip_core::time::Millis;
use proptest::prelude::*;
use proptest::sample::Index;

/// A rule `id` with `limits` and `adaptive` as the stores' operations take it (no budget; classes
/// with default `c0`, for `Scenario::rule` to keep or drop).
pub fn rule_with(id: &str, limits: &[Limit], adaptive: Option<Adaptive>) -> Rule {
    static BASE: std::sync::LazyLock<RuleSet> = std::sync::LazyLock::new(|| {
        let text = "default_dlq_topic: dlq\nrules:\n  - name: base\n    key: \"{attributes.k}\"\n    \
            limits: [ { limit: 10, per: 1s } ]\n    max_delay: 1h\n    classes: { from: \"{attributes.c}\", default: c0 }\n    \
            forward: { topic: ready }\n    overflow_topic: overflow\n";
        RuleSet::parse("scenario.yaml", text).expect("the scenario's base rule")
    });
    let mut rule = BASE.rule("base").expect("base").clone();
    (rule.id, rule.name) = (id.to_owned(), id.to_owned());
    rule.limits = limits.to_vec();
    rule.adaptive = adaptive;
    rule
}

/// A rule `id` with `limits` only: no budget, no classes, no adaptive limit.
pub fn plain_rule(id: &str, limits: &[Limit]) -> Rule {
    Rule { classes: None, ..rule_with(id, limits, None) }
}

/// 2026-08-03T12:00:00Z, the seed article's day.
pub const T0: Millis = 1_785_758_400_000;

#[derive(Debug, Clone)]
pub struct Scenario {
    pub limits: Vec<Limit>,
    pub max_delay: Millis,
    pub events: Vec<Arrival>,
    /// Override changes, each made just before the event at its index.
    pub overrides: Vec<OverrideOp>,
    /// A rule edit: from the event at this index on, the rule has these limits.
    pub edit: Option<(usize, Vec<Limit>)>,
    /// Pauses (the downstream said wait): before the event at `.0`, entity `.1` waits until `.2`.
    pub pauses: Vec<(usize, usize, Millis)>,
    /// Shared budgets, adaptive limits and the feedback that moves them.
    pub shared: Shared,
}

#[derive(Debug, Clone, Default)]
pub struct Shared {
    /// The budgets every event draws from.
    pub budgets: Vec<Arc<Budget>>,
    /// The events that draw from `budgets`, when not all do (empty: all): the rule gains its
    /// budgets at the first of each span and loses them at its end, which moves it from the
    /// script's lean shape to the general one and back.
    pub budgeted: Vec<std::ops::Range<usize>>,
    /// The rule's classes calendar (`Classes::calendar`, floors named `c0`, `c1`, ...) when it has
    /// classes, and what a classed event draws from: it, then `budgets`.
    pub classes: Option<Arc<Budget>>,
    pub draws: Vec<Arc<Budget>>,
    /// The entities are split over this many rules (entity `e` is rule `e % rules`'s), so that
    /// budgets' floors (naming rules `r0`, `r1`, ...) have rules to hold for; 0 or 1: one rule.
    pub rules: usize,
    /// The rule's adaptive limit.
    pub adaptive: Option<Adaptive>,
    /// Before the event at `.0`, a 429/5xx/timeout for entity `.1` (`None`: for the first budget).
    pub signals: Vec<(usize, Option<usize>)>,
    /// Before the event at `.0`, the budget at `.1` pauses until `.2`.
    pub budget_pauses: Vec<(usize, usize, Millis)>,
    /// The rule's `delivery_margin`.
    pub margin: Millis,
    /// Before the event at `.0`, the cost reported after the call of the message of the event at
    /// `.1` (an earlier one) is `.2`.
    pub corrections: Vec<(usize, usize, u64)>,
    /// The rule parks a throttled key's backlog past this horizon (`ReserveRequest::park`).
    pub park: Option<Millis>,
    /// Before the event at `.0`, entity `.1`'s drain runs: it arms a wake, then unparks its
    /// queue's head until one is not booked by now + `.2` (the deadline).
    pub drains: Vec<(usize, usize, Millis)>,
}

impl Scenario {
    /// The entity that reserves `arrival`: its key, or for a rule with classes `<key>#c<class>`.
    pub fn entity_key(&self, arrival: &Arrival) -> String {
        match self.shared.classes {
            Some(_) if !arrival.unclassed => format!("entity_{}#c{}", arrival.entity, arrival.class),
            _ => arrival.key(),
        }
    }

    /// The rule of `entity`'s events, for a run whose rule is named `base`: `base` itself, or
    /// `base-r<i>` when the entities are split over rules (and budgets' floors name `r<i>`).
    pub fn rule_of(&self, base: &str, entity: usize) -> String {
        match self.shared.rules {
            0 | 1 => base.to_owned(),
            rules => format!("{base}-r{}", entity % rules),
        }
    }

    /// The rule `id` as the stores' operations take it (overrides, pauses, signals): the
    /// scenario's limits before any edit, its adaptive limit, budgets and classes calendar.
    pub fn rule(&self, id: &str) -> Rule {
        let mut rule = rule_with(id, self.limits_at(0), self.shared.adaptive);
        rule.budgets = self.shared.budgets.clone();
        rule.classes = match (rule.classes, &self.shared.classes) {
            (Some(classes), Some(calendar)) => {
                // Every class the scenario's events name (`c0`, the default, and up).
                let most = self.events.iter().map(|a| a.class).max().unwrap_or(0);
                let names = (0..=most).map(|c| format!("c{c}")).collect();
                Some(Classes { calendar: calendar.clone(), draws: self.shared.draws.clone(), names, ..classes })
            }
            _ => None,
        };
        rule
    }

    /// The rule's limits when the event at `index` arrives.
    pub fn limits_at(&self, index: usize) -> &[Limit] {
        match &self.edit {
            Some((from, limits)) if index >= *from => limits,
            _ => &self.limits,
        }
    }

    /// Every limit the rule had, once per state (to read an entity's whole state back).
    pub fn all_limits(&self) -> Vec<Limit> {
        let mut seen = std::collections::HashSet::new();
        let edited = self.edit.iter().flat_map(|(_, limits)| limits.iter());
        self.limits.iter().chain(edited).filter(|l| seen.insert(state_id(l))).copied().collect()
    }
}

/// `drip limits set` (with `set`) or `delete` (without) of one entity's limit, before an event.
#[derive(Debug, Clone, Copy)]
pub struct OverrideOp {
    pub before_event: usize,
    pub entity: usize,
    pub limit: usize,
    pub set: Option<LimitOverride>,
}

impl OverrideOp {
    pub fn key(&self) -> String {
        format!("entity_{}", self.entity)
    }
}

#[derive(Debug, Clone)]
pub struct Arrival {
    pub entity: usize,
    pub id: String,
    pub cost: u64,
    pub now: Millis,
    /// When it was published: its first delivery's `now`, on every redelivery.
    pub published: Millis,
    /// The same message id was delivered before.
    pub redelivery: bool,
    /// A redelivery that asks for a new slot (its attempt was told to wait by the downstream, or
    /// was never delivered), its old slot's units kept or given back.
    pub reslot: Option<OldSlot>,
    /// A frontier carried over from the rule's previous key.
    pub floor: Option<Millis>,
    /// Its class, for a rule with classes (`Shared::classes`).
    pub class: usize,
    /// Reserved before the rule had classes (a rule that gains them at a later event): by its key.
    pub unclassed: bool,
}

impl Arrival {
    pub fn key(&self) -> String {
        format!("entity_{}", self.entity)
    }
}

/// Which kinds of window a scenario may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    All,
    /// Fixed windows placed at their start and sliding windows: the kinds that promise the
    /// earliest feasible slot.
    EarliestFeasible,
}

pub fn limit(kinds: Kinds) -> impl Strategy<Value = Limit> {
    let kind_count = if kinds == Kinds::All { 4u8 } else { 2 };
    (0..kind_count, 1u64..=6, prop::sample::select(vec![100i64, 250, 400, 1_000, 1_500, 3_000]), 1u64..=4).prop_map(
        |(kind, limit, per, burst)| {
            let window = match kind {
                0 => Window::Fixed(Placement::Start),
                1 => Window::Sliding,
                2 => Window::Fixed(Placement::Spread),
                _ => Window::Gcra { burst },
            };
            Limit::new(limit, per, window).unwrap()
        },
    )
}

pub fn scenario(kinds: Kinds, max_events: usize) -> impl Strategy<Value = Scenario> {
    let limits = prop::collection::vec(limit(kinds), 1..=3).prop_map(|limits| {
        let mut seen = std::collections::HashSet::new();
        limits.into_iter().filter(|l| seen.insert(state_id(l))).collect::<Vec<_>>()
    });
    let arrivals = prop::collection::vec(
        (0..3usize, 0i64..300, 0u64..6, prop::option::weighted(0.15, (any::<Index>(), prop::bool::weighted(0.2)))),
        1..max_events,
    );
    (limits, prop_oneof![Just(0i64), 0i64..3_000, 0i64..30_000], 0i64..60_000, arrivals).prop_map(
        |(limits, max_delay, offset, arrivals)| {
            let smallest = limits.iter().map(|l| l.max_cost(l.limit())).min().unwrap_or(1);
            let mut now = T0 + offset;
            let mut events: Vec<Arrival> = Vec::new();
            for (i, (entity, gap, cost_seed, redeliver)) in arrivals.into_iter().enumerate() {
                now += gap;
                let event = match redeliver {
                    // A republished id (same id, a later publish time) is another message for both
                    // stores: answers are filed by id and minute of publication.
                    Some((index, republished)) if !events.is_empty() => {
                        let first = &events[index.index(events.len())];
                        let published = if republished { now } else { first.published };
                        Arrival { now, redelivery: true, published, ..first.clone() }
                    }
                    _ => Arrival {
                        entity,
                        id: format!("m{i}"),
                        cost: 1 + cost_seed % smallest,
                        now,
                        published: now,
                        redelivery: false,
                        reslot: None,
                        floor: None,
                        class: 0,
                        unclassed: false,
                    },
                };
                events.push(event);
            }
            Scenario {
                limits,
                max_delay,
                events,
                overrides: Vec::new(),
                edit: None,
                pauses: Vec::new(),
                shared: Shared::default(),
            }
        },
    )
}

/// A scenario with overrides raising, lowering, ending and deleting the entities' limits between
/// events (counts 1..=8, so some fall below an event's cost).
pub fn scenario_with_overrides(max_events: usize) -> impl Strategy<Value = Scenario> {
    (scenario(Kinds::All, max_events), override_ops()).prop_map(|(mut scenario, ops)| {
        add_overrides(&mut scenario, ops);
        scenario
    })
}

/// Raw override operations: before which event, which entity and limit, what (delete, set for
/// ever, for a while, until a later event), the count and how long.
type RawOverride = (Index, usize, Index, u8, u64, i64);

fn override_ops() -> impl Strategy<Value = Vec<RawOverride>> {
    prop::collection::vec((any::<Index>(), 0..3usize, any::<Index>(), 0u8..4, 1u64..=8, 0i64..2_000), 0..8)
}

/// Adds `ops` to the scenario's overrides (of its limits as they are now), in event order.
fn add_overrides(scenario: &mut Scenario, ops: Vec<RawOverride>) {
    for (at, entity, limit, what, count, lasts) in ops {
        let before_event = at.index(scenario.events.len());
        let now = scenario.events[before_event].now;
        // Ending exactly at a later event's time probes the boundary (`until` is exclusive).
        let later = scenario.events[(before_event + (lasts as usize) % 5).min(scenario.events.len() - 1)].now;
        let set = match what {
            0 => None,
            1 => Some(LimitOverride { limit: count, until: None }),
            2 => Some(LimitOverride { limit: count, until: Some(now + lasts) }),
            _ => Some(LimitOverride { limit: count, until: Some(later) }),
        };
        scenario.overrides.push(OverrideOp { before_event, entity, limit: limit.index(scenario.limits.len()), set });
    }
    scenario.overrides.sort_by_key(|op| op.before_event);
}

/// A scenario whose rule is edited once, at a random event, to another random set of limits
/// (costs stay within both sets).
pub fn scenario_with_an_edit(max_events: usize) -> impl Strategy<Value = Scenario> {
    let limits = prop::collection::vec(limit(Kinds::All), 1..=3).prop_map(|limits| {
        let mut seen = std::collections::HashSet::new();
        limits.into_iter().filter(|l| seen.insert(override_id(l))).collect::<Vec<_>>()
    });
    (scenario(Kinds::All, max_events), limits, any::<Index>()).prop_map(|(mut scenario, after, at)| {
        let smallest = after.iter().map(|l| l.max_cost(l.limit())).min().unwrap_or(1);
        for event in &mut scenario.events {
            event.cost = event.cost.min(smallest);
        }
        scenario.edit = Some((at.index(scenario.events.len()), after));
        scenario
    })
}

/// For scenarios with a rule edit: slots never go backwards per entity, and every window of a
/// limit after the edit that holds a slot reserved after it holds no more than the larger of that
/// limit and the one before with the same state (none when the edit changed its kind or period).
pub fn check_edit_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let Some((from, after)) = &scenario.edit else { return check_schedule(scenario, answers) };
    let mut ledgers: BTreeMap<usize, Vec<(Millis, u64, bool)>> = BTreeMap::new();
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        if answer.replayed() || answer.status != Status::Reserved {
            continue;
        }
        let ledger = ledgers.entry(arrival.entity).or_default();
        if ledger.last().is_some_and(|&(last, _, _)| answer.slot < last) {
            return Err(format!("{arrival:?} got {answer:?}, before the entity's previous slot"));
        }
        ledger.push((answer.slot, arrival.cost, i >= *from));
    }
    for (entity, ledger) in &ledgers {
        for limit in after {
            let before = scenario.limits.iter().find(|l| state_id(l) == state_id(limit)).map_or(0, Limit::limit);
            let bound = limit.limit().max(before);
            let per = limit.per();
            // Windows (fixed) or intervals starting at a slot (sliding) that hold a post-edit slot.
            let starts: Vec<Millis> = match limit.window() {
                Window::Fixed(_) => ledger.iter().filter(|e| e.2).map(|e| e.0.div_euclid(per) * per).collect(),
                Window::Sliding => ledger.iter().map(|e| e.0).collect(),
                Window::Gcra { .. } => continue,
            };
            for start in starts {
                let inside: Vec<_> = ledger.iter().filter(|e| e.0 >= start && e.0 < start + per).collect();
                let used: u64 = inside.iter().map(|e| e.1).sum();
                if inside.iter().any(|e| e.2) && used > bound {
                    return Err(format!("entity {entity}, {limit:?}: [{start}, +{per}) holds {used}, over {bound}"));
                }
            }
        }
    }
    Ok(())
}

/// Checks one run's answers (one per arrival, in order) against every invariant that can be read
/// off the schedule: limits hold in every window, slots never go backwards per entity, slots lie
/// within `max_delay` exactly when reserved, redeliveries repeat the first answer, and, for the
/// kinds that promise it, each slot is the earliest feasible one.
pub fn check_schedule(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    assert_eq!(scenario.events.len(), answers.len());
    let mut first_answer: HashMap<(usize, &str, Millis), Reservation> = HashMap::new();
    let mut ledgers: BTreeMap<usize, Vec<(Millis, u64)>> = BTreeMap::new();
    for (arrival, answer) in scenario.events.iter().zip(answers) {
        let at = format!("{arrival:?} got {answer:?}");
        let filed = (arrival.entity, arrival.id.as_str(), arrival.published.div_euclid(ANSWER_MINUTE));
        if let Some(first) = first_answer.get(&filed) {
            if !answer.replayed()
                || (answer.slot, answer.status, answer.decided_at) != (first.slot, first.status, first.decided_at)
            {
                return Err(format!("redelivery changed the answer: first {first:?}; {at}"));
            }
            continue;
        }
        if answer.replayed() || answer.decided_at != arrival.now {
            return Err(format!("a new message was treated as a redelivery: {at}"));
        }
        first_answer.insert(filed, *answer);
        let ledger = ledgers.entry(arrival.entity).or_default();
        let previous = ledger.last().map(|&(slot, _)| slot);
        let start = previous.map_or(arrival.now, |p| p.max(arrival.now));
        if answer.slot < start {
            return Err(format!("slot before max(now, previous slot) {start}: {at}"));
        }
        let late = answer.slot > arrival.now + scenario.max_delay;
        if late != (answer.status == Status::MaxDelayExceeded) {
            return Err(format!("status disagrees with max_delay {}: {at}", scenario.max_delay));
        }
        if answer.status == Status::Reserved {
            if let Some(earlier) = earlier_feasible(&scenario.limits, ledger, arrival.cost, start, answer.slot) {
                return Err(format!("{earlier} was feasible and earlier: {at}"));
            }
            ledger.push((answer.slot, arrival.cost));
        }
    }
    for (entity, ledger) in &ledgers {
        check_limits(&scenario.limits, ledger).map_err(|e| format!("entity {entity}: {e}"))?;
    }
    Ok(())
}

/// A scenario with pauses of the entities, redeliveries that ask for a new slot, and arrivals that
/// carry a frontier over from a previous key.
pub fn scenario_with_pauses(max_events: usize) -> impl Strategy<Value = Scenario> {
    let pauses = prop::collection::vec((any::<Index>(), 0..3usize, 0i64..3_000), 0..6);
    let reslots = prop::collection::vec((any::<Index>(), any::<bool>()), 0..6);
    let floors = prop::collection::vec((any::<Index>(), -1_000i64..3_000), 0..6);
    (scenario(Kinds::All, max_events), pauses, reslots, floors).prop_map(|(mut scenario, pauses, reslots, floors)| {
        for (at, ahead) in floors {
            let i = at.index(scenario.events.len());
            scenario.events[i].floor = Some(scenario.events[i].now + ahead);
        }
        for (at, entity, lasts) in pauses {
            let before = at.index(scenario.events.len());
            scenario.pauses.push((before, entity, scenario.events[before].now + lasts));
        }
        reslot_redeliveries(&mut scenario, reslots);
        scenario
    })
}

/// Makes some redeliveries ask for a new slot, their old one given back or kept.
fn reslot_redeliveries(scenario: &mut Scenario, reslots: Vec<(Index, bool)>) {
    for (at, gives_back) in reslots {
        let i = at.index(scenario.events.len());
        if scenario.events[i].redelivery {
            scenario.events[i].reslot = Some(if gives_back { OldSlot::GivenBack } else { OldSlot::Kept });
        }
    }
}

/// Slots and their costs, in time order.
type Ledger = Vec<(Millis, u64)>;

/// The slots in use, per entity and across them: what a consumer would receive. A message given a
/// new slot with its old one given back no longer counts at the old one (one that keeps it does).
#[derive(Default)]
struct InUse<'a> {
    ledgers: BTreeMap<usize, Ledger>,
    everyone: Ledger,
    frontiers: HashMap<usize, Millis>,
    by_message: HashMap<&'a str, (Millis, u64)>,
}

impl<'a> InUse<'a> {
    /// Takes the arrival's answer in (a fresh decision); returns the entity's frontier before it.
    fn take(&mut self, arrival: &'a Arrival, answer: &Reservation) -> Option<Millis> {
        self.take_delivered(arrival, answer, answer.slot)
    }

    /// The same for an event delivered at `at` (its slot, or later within the margin).
    fn take_delivered(&mut self, arrival: &'a Arrival, answer: &Reservation, at: Millis) -> Option<Millis> {
        if arrival.reslot == Some(OldSlot::GivenBack)
            && let Some(old) = self.by_message.remove(arrival.id.as_str())
        {
            let ledger = self.ledgers.entry(arrival.entity).or_default();
            if let Some(at) = ledger.iter().position(|&entry| entry == old) {
                ledger.remove(at);
            }
            if let Some(at) = self.everyone.iter().position(|&entry| entry == old) {
                self.everyone.remove(at);
            }
        }
        if answer.status != Status::Reserved {
            return None;
        }
        let entry = (at, arrival.cost);
        self.by_message.insert(&arrival.id, entry);
        self.ledgers.entry(arrival.entity).or_default().push(entry);
        self.everyone.push(entry);
        self.frontiers.insert(arrival.entity, answer.slot)
    }

    fn sorted(mut self) -> (BTreeMap<usize, Ledger>, Ledger) {
        self.ledgers.values_mut().for_each(|ledger| ledger.sort());
        self.everyone.sort();
        (self.ledgers, self.everyone)
    }
}

/// The pauses made before the event at `i`, into `paused` (by entity: the latest end).
fn take_pauses(scenario: &Scenario, i: usize, paused: &mut HashMap<usize, Millis>) {
    for &(_, entity, until) in scenario.pauses.iter().filter(|p| p.0 == i) {
        let current = paused.entry(entity).or_insert(until);
        *current = (*current).max(until);
    }
}

/// For scenarios with pauses: per entity, slots never go backwards in reservation order, none
/// reserved after a pause lies before its end, and every limit holds over the slots in use.
pub fn check_pause_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let mut in_use = InUse::default();
    let mut paused: HashMap<usize, Millis> = HashMap::new();
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        take_pauses(scenario, i, &mut paused);
        if answer.replayed() {
            continue;
        }
        if in_use.take(arrival, answer).is_some_and(|last| answer.slot < last) {
            return Err(format!("{arrival:?} got {answer:?}, before the entity's previous slot"));
        }
        if answer.status != Status::Reserved {
            continue;
        }
        if arrival.floor.is_some_and(|floor| answer.slot < floor) {
            return Err(format!("{arrival:?} got {answer:?}, before the frontier it carried"));
        }
        if paused.get(&arrival.entity).is_some_and(|&until| answer.slot < until) {
            return Err(format!("{arrival:?} got {answer:?}, inside a pause until {:?}", paused[&arrival.entity]));
        }
    }
    for (entity, ledger) in &in_use.sorted().0 {
        check_limits(&scenario.limits, ledger).map_err(|e| format!("entity {entity}: {e}"))?;
    }
    Ok(())
}

/// For scenarios with overrides: per entity, slots never go backwards, an event is refused for its
/// cost only when some count in force was below it, and no fixed window or sliding interval holds
/// more than the largest count its limit had during the scenario.
pub fn check_overridden_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let mut ledgers: BTreeMap<usize, Vec<(Millis, u64)>> = BTreeMap::new();
    for (arrival, answer) in scenario.events.iter().zip(answers) {
        if answer.replayed() || answer.status != Status::Reserved {
            if answer.status == Status::CostExceedsLimit && !answer.replayed() {
                let lowered = scenario
                    .overrides
                    .iter()
                    .any(|o| o.entity == arrival.entity && o.set.is_some_and(|set| set.limit < arrival.cost));
                if !lowered {
                    return Err(format!("{arrival:?} refused for its cost, but no override was below it"));
                }
            }
            continue;
        }
        let ledger = ledgers.entry(arrival.entity).or_default();
        if ledger.last().is_some_and(|&(last, _)| answer.slot < last) {
            return Err(format!("{arrival:?} got {answer:?}, before the entity's previous slot"));
        }
        ledger.push((answer.slot, arrival.cost));
    }
    for (entity, ledger) in &ledgers {
        for (i, limit) in scenario.limits.iter().enumerate() {
            let largest = scenario
                .overrides
                .iter()
                .filter(|o| o.entity == *entity && o.limit == i)
                .filter_map(|o| o.set.map(|set| set.limit))
                .fold(limit.limit(), u64::max);
            let used = match limit.window() {
                Window::Fixed(_) => fixed_window_usage(ledger, limit.per()).into_values().max().unwrap_or(0),
                Window::Sliding => max_sliding_usage(ledger, limit.per()),
                Window::Gcra { .. } => continue,
            };
            if used > largest {
                return Err(format!("entity {entity}, {limit:?}: a window holds {used}, over {largest}"));
            }
        }
    }
    Ok(())
}

/// No fixed window and no sliding interval holds more than its limit; gcra keeps its rate.
pub fn check_limits(limits: &[Limit], ledger: &[(Millis, u64)]) -> Result<(), String> {
    for limit in limits {
        match limit.window() {
            Window::Fixed(_) => {
                if let Some((window, used)) =
                    fixed_window_usage(ledger, limit.per()).into_iter().find(|&(_, u)| u > limit.limit())
                {
                    return Err(format!("{limit:?}: window {window} holds {used}"));
                }
            }
            Window::Sliding => {
                let used = max_sliding_usage(ledger, limit.per());
                if used > limit.limit() {
                    return Err(format!("{limit:?}: an interval holds {used}"));
                }
            }
            Window::Gcra { burst } => {
                if let Some((i, j)) = gcra_violation(ledger, limit.limit(), limit.per(), burst) {
                    return Err(format!("{limit:?}: slots {:?} .. {:?} are too dense", ledger[i], ledger[j]));
                }
            }
        }
    }
    Ok(())
}

/// For fixed-start and sliding limits only: a time in `[start, slot)` where every limit had room,
/// found by brute force over every time at which feasibility can change.
fn earliest_feasible_candidates(
    limits: &[Limit],
    ledger: &[(Millis, u64)],
    start: Millis,
    slot: Millis,
) -> Vec<Millis> {
    let mut candidates = vec![start];
    for limit in limits {
        let mut window = start.div_euclid(limit.per()) * limit.per() + limit.per();
        while window < slot {
            candidates.push(window);
            window += limit.per();
        }
        candidates.extend(ledger.iter().map(|&(s, _)| s + limit.per()).filter(|&t| t > start && t < slot));
    }
    candidates
}

fn earlier_feasible(
    limits: &[Limit],
    ledger: &[(Millis, u64)],
    cost: u64,
    start: Millis,
    slot: Millis,
) -> Option<Millis> {
    let promises_earliest =
        limits.iter().all(|l| matches!(l.window(), Window::Fixed(Placement::Start) | Window::Sliding));
    if !promises_earliest {
        return None;
    }
    let has_room = |t: Millis| {
        limits.iter().all(|limit| {
            let used: u64 = match limit.window() {
                Window::Sliding => {
                    ledger.iter().filter(|&&(s, _)| s > t - limit.per() && s <= t).map(|&(_, c)| c).sum()
                }
                _ => {
                    let window = t.div_euclid(limit.per()) * limit.per();
                    ledger
                        .iter()
                        .filter(|&&(s, _)| s.div_euclid(limit.per()) * limit.per() == window)
                        .map(|&(_, c)| c)
                        .sum()
                }
            };
            used + cost <= limit.limit()
        })
    };
    earliest_feasible_candidates(limits, ledger, start, slot).into_iter().filter(|&t| t < slot).find(|&t| has_room(t))
}

fn adaptive() -> impl Strategy<Value = Adaptive> {
    (0u64..300_000, 300_000u64..950_000, 50_000u64..500_000, 50_000u64..400_000).prop_map(
        |(margin, decrease, min, step)| Adaptive { margin, decrease, min: min.min(PPM - margin), step, latency: None },
    )
}

/// One or two shared budgets (fixed windows, start or spread; sometimes a fair share, sometimes
/// adaptive, sometimes floors for one or both of two rules the entities are split over, the
/// second sometimes held for one key of its rule only) that
/// every event also draws from, an adaptive rule sometimes, 429s for entities and the first
/// budget between events, and pauses of the budgets.
pub fn scenario_with_budgets(max_events: usize) -> impl Strategy<Value = Scenario> {
    let budget_limit = (2u64..=8, prop::sample::select(vec![250i64, 500, 1_000, 2_000]), any::<bool>());
    let budget = (
        prop::collection::vec(budget_limit, 1..=2),
        prop::option::weighted(0.5, 200_000u64..=900_000),
        prop::option::weighted(0.4, adaptive()),
        prop::option::weighted(0.5, (50_000u64..=700_000, 0u64..=300_000, any::<bool>())),
    );
    let budgets = prop::collection::vec(budget, 1..=2);
    let signals = prop::collection::vec((any::<Index>(), prop::option::weighted(0.7, 0..3usize)), 0..6);
    let pauses = prop::collection::vec((any::<Index>(), any::<Index>(), 0i64..3_000), 0..3);
    let reslots = prop::collection::vec((any::<Index>(), any::<bool>()), 0..6);
    let shared = (budgets, prop::option::weighted(0.4, adaptive()), signals, pauses, reslots);
    (scenario(Kinds::All, max_events), shared).prop_map(
        |(mut scenario, (budgets, adaptive, signals, pauses, reslots))| {
            reslot_redeliveries(&mut scenario, reslots);
            let budgets: Vec<Arc<Budget>> = budgets
                .into_iter()
                .enumerate()
                .map(|(i, (limits, max_share, adaptive, floors))| {
                    let mut seen = std::collections::HashSet::new();
                    let limits = limits
                        .into_iter()
                        .filter(|(_, per, _)| seen.insert(*per))
                        .map(|(n, per, spread)| {
                            let placement = if spread { Placement::Spread } else { Placement::Start };
                            Limit::new(n, per, Window::Fixed(placement)).unwrap()
                        })
                        .collect();
                    // The second floor is rule r1's, or sometimes only its key `entity_1`'s.
                    let floors = floors.map_or_else(Vec::new, |(r0, r1, keyed)| {
                        let member = if keyed { "r1|entity_1" } else { "r1" };
                        let second = (r1 > 0).then(|| (member.to_owned(), r1));
                        std::iter::once(("r0".to_owned(), r0)).chain(second).collect()
                    });
                    Arc::new(Budget {
                        name: format!("b{i}"),
                        limits,
                        max_share,
                        adaptive,
                        floors,
                        per_key: false,
                        fair: None,
                        leases: None,
                        tag: "b0".into(),
                    })
                })
                .collect();
            let rules = if budgets.iter().any(|b| !b.floors.is_empty()) { 2 } else { 1 };
            let smallest = budgets.iter().flat_map(|b| &b.limits).map(Limit::limit).min().unwrap_or(1);
            for event in &mut scenario.events {
                event.cost = event.cost.min(smallest);
            }
            let n = scenario.events.len();
            let mut signals: Vec<(usize, Option<usize>)> =
                signals.into_iter().map(|(at, entity)| (at.index(n), entity)).collect();
            signals.sort_by_key(|s| s.0);
            let mut budget_pauses: Vec<(usize, usize, Millis)> = pauses
                .into_iter()
                .map(|(at, which, lasts)| {
                    let before = at.index(n);
                    (before, which.index(budgets.len()), scenario.events[before].now + lasts)
                })
                .collect();
            budget_pauses.sort_by_key(|p| p.0);
            scenario.shared = Shared { budgets, adaptive, signals, budget_pauses, rules, ..Shared::default() };
            scenario
        },
    )
}

/// Budgets, adaptive limits and their signals, pauses of keys and of budgets, new slots, with the
/// rule parking a throttled key's backlog and random drains of the keys' queues.
pub fn scenario_with_parking(max_events: usize) -> impl Strategy<Value = Scenario> {
    let pauses = prop::collection::vec((any::<Index>(), 0..3usize, 0i64..3_000), 0..6);
    let drains = prop::collection::vec((any::<Index>(), 0..3usize, 0i64..2_000), 0..12);
    let adaptive = prop::option::weighted(0.7, adaptive());
    (scenario_with_budgets(max_events), pauses, drains, 0i64..1_500, adaptive).prop_map(
        |(mut scenario, pauses, drains, horizon, adaptive)| {
            let n = scenario.events.len();
            for (at, entity, lasts) in pauses {
                let before = at.index(n);
                scenario.pauses.push((before, entity, scenario.events[before].now + lasts));
            }
            scenario.shared.drains =
                drains.into_iter().map(|(at, entity, ahead)| (at.index(n), entity, ahead)).collect();
            scenario.shared.park = Some(horizon);
            scenario.shared.adaptive = scenario.shared.adaptive.or(adaptive);
            scenario
        },
    )
}

/// A parking scenario whose first budget is fair (weights 1 to 4 for some keys): an event whose
/// slot lies past the budget's near horizon parks, its key joins the budget's ring, and drains
/// book the ring's keys' heads within the near horizon.
pub fn scenario_with_fair_budgets(max_events: usize) -> impl Strategy<Value = Scenario> {
    let weights = prop::collection::btree_map(0..3usize, 1u64..=4, 0..3);
    (scenario_with_parking(max_events), weights).prop_map(|(mut scenario, weights)| {
        let weights = weights.into_iter().map(|(entity, w)| (format!("entity_{entity}"), w)).collect();
        let fair = Some(drip_core::fair::Fair { weights });
        let first = Arc::new(Budget { fair, ..(*scenario.shared.budgets[0]).clone() });
        scenario.shared.budgets[0] = first;
        scenario
    })
}

/// A scenario whose budgets are leased over 2 to 4 partitions, each asking its home for a chunk of
/// anything from one unit to a whole window at a time (sometimes adaptive, with 429s that lower
/// the first budget's level between events; no floors or spread placement: a leased budget has
/// none); arrivals compressed so that backlogs book ahead and the homes run out of room.
pub fn scenario_with_leases(max_events: usize) -> impl Strategy<Value = Scenario> {
    (scenario_with_budgets(max_events), budget_leases()).prop_map(leased)
}

/// A parking scenario (pauses of keys and budgets, adaptive keys, drains at random moments) whose
/// budgets are leased as in [`scenario_with_leases`]: a drain's unpark, too, asks a home for units
/// when its partition's pool has none.
pub fn scenario_with_leased_parking(max_events: usize) -> impl Strategy<Value = Scenario> {
    (scenario_with_parking(max_events), budget_leases()).prop_map(leased)
}

/// A fair budget (with weights) leased as in [`scenario_with_leases`]: each key parks in its
/// partition's ring, and a drain's unparks of a ring's heads in one call stop for a lease where
/// the partition's pool has none, the heads behind in its demand.
pub fn scenario_with_fair_leased_budgets(max_events: usize) -> impl Strategy<Value = Scenario> {
    (scenario_with_fair_budgets(max_events), budget_leases()).prop_map(leased)
}

/// Partitions and chunk of each of two budgets' leases, and how much arrivals are compressed.
fn budget_leases() -> impl Strategy<Value = (Vec<(u32, u64)>, i64)> {
    (prop::collection::vec((2u32..=4, 1u64..=PPM), 2), 1i64..=4)
}

fn leased((mut scenario, (leases, squeeze)): (Scenario, (Vec<(u32, u64)>, i64))) -> Scenario {
    let partitions = leases[0].0;
    let budgets = scenario.shared.budgets.iter().zip(&leases).map(|(b, &(_, chunk))| {
        let limits = b.limits.iter().map(|l| Limit::new(l.limit(), l.per(), Window::Fixed(Placement::Start)).unwrap());
        Arc::new(Budget {
            limits: limits.collect(),
            floors: Vec::new(),
            leases: Some(drip_core::budgets::Leases { partitions, chunk }),
            ..(**b).clone()
        })
    });
    scenario.shared.budgets = budgets.collect();
    scenario.shared.rules = 1;
    let start = scenario.events.first().map_or(0, |a| a.now);
    for event in &mut scenario.events {
        event.now = start + (event.now - start) / squeeze;
        event.published = start + (event.published - start) / squeeze;
    }
    scenario
}

/// For scenarios with budgets: per entity, slots never go backwards and the rule's limits hold;
/// across every entity, no window of a budget limit holds more than its count; one entity takes
/// no more of a budget window than its fair share (or one event's cost, when that is more); no
/// slot lies inside a pause of a budget.
pub fn check_budget_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let mut in_use = InUse::default();
    let mut paused: Vec<Millis> = vec![Millis::MIN; scenario.shared.budgets.len()];
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        for &(_, budget, until) in scenario.shared.budget_pauses.iter().filter(|p| p.0 == i) {
            paused[budget] = paused[budget].max(until);
        }
        if answer.replayed() {
            continue;
        }
        if in_use.take(arrival, answer).is_some_and(|last| answer.slot < last) {
            return Err(format!("{arrival:?} got {answer:?}, before the entity's previous slot"));
        }
        if answer.status != Status::Reserved {
            continue;
        }
        if let Some(until) = paused.iter().find(|&&until| answer.slot < until) {
            return Err(format!("{arrival:?} got {answer:?}, inside a budget's pause until {until}"));
        }
    }
    let (ledgers, everyone) = in_use.sorted();
    let largest_cost = scenario.events.iter().map(|e| e.cost).max().unwrap_or(1);
    for budget in &scenario.shared.budgets {
        check_limits(&budget.limits, &everyone).map_err(|e| format!("budget {}: {e}", budget.name))?;
        for (entity, ledger) in &ledgers {
            for limit in &budget.limits {
                if let Some(share) = budget.share_of(limit.limit(), largest_cost) {
                    let fair = Limit::new(share, limit.per(), Window::Fixed(Placement::Start)).unwrap();
                    check_limits(&[fair], ledger)
                        .map_err(|e| format!("entity {entity}'s share of budget {}: {e}", budget.name))?;
                }
            }
        }
    }
    for (entity, ledger) in &ledgers {
        check_limits(&scenario.limits, ledger).map_err(|e| format!("entity {entity}: {e}"))?;
    }
    Ok(())
}

/// A scenario whose rule has a delivery margin (at most half of its shortest fixed or sliding
/// window), sometimes with a shared budget too.
pub fn scenario_with_margin(max_events: usize) -> impl Strategy<Value = Scenario> {
    (prop_oneof![scenario(Kinds::All, max_events), scenario_with_budgets(max_events)], 1i64..=60).prop_map(
        |(mut scenario, margin)| {
            let budget_limits = scenario.shared.budgets.iter().flat_map(|b| b.limits.clone());
            let shortest = scenario
                .limits
                .iter()
                .copied()
                .chain(budget_limits)
                .filter(|l| !matches!(l.window(), Window::Gcra { .. }))
                .map(|l| l.per())
                .min()
                .unwrap_or(1_000);
            scenario.shared.margin = margin.min(shortest / 2);
            scenario
        },
    )
}

/// For scenarios with a delivery margin: every fixed window and sliding interval holds at most
/// its limit when each reserved event is delivered up to the margin late (lateness spread over
/// [0, margin) by event), for the entity's limits and the budgets alike.
pub fn check_delivery_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let margin = scenario.shared.margin;
    let mut in_use = InUse::default();
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        if !answer.replayed() {
            let late = if margin > 0 { (i as i64 * 37) % margin } else { 0 };
            in_use.take_delivered(arrival, answer, answer.slot + late);
        }
    }
    let not_gcra: Vec<Limit> =
        scenario.limits.iter().copied().filter(|l| !matches!(l.window(), Window::Gcra { .. })).collect();
    let (delivered, everyone) = in_use.sorted();
    for budget in &scenario.shared.budgets {
        check_limits(&budget.limits, &everyone).map_err(|e| format!("budget {} at delivery: {e}", budget.name))?;
    }
    for (entity, ledger) in &delivered {
        check_limits(&not_gcra, ledger).map_err(|e| format!("entity {entity} at delivery: {e}"))?;
    }
    check_schedule_or_budgets(scenario, answers)
}

fn check_schedule_or_budgets(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    if scenario.shared.budgets.is_empty() && scenario.shared.margin == 0 {
        check_schedule(scenario, answers)
    } else {
        check_budget_bounds(scenario, answers)
    }
}

/// A scenario (with budgets, or not) where the costs of some messages are reported after their
/// call: each correction names an earlier event and the cost it really had (0 to 4 units).
pub fn scenario_with_corrections(max_events: usize) -> impl Strategy<Value = Scenario> {
    let corrections = prop::collection::vec((any::<Index>(), any::<Index>(), 0u64..=4), 1..10);
    (prop_oneof![scenario(Kinds::All, max_events), scenario_with_budgets(max_events)], corrections).prop_map(
        |(mut scenario, corrections)| {
            let n = scenario.events.len();
            let mut corrections: Vec<(usize, usize, u64)> = corrections
                .into_iter()
                .filter_map(|(at, of, actual)| {
                    let before = at.index(n);
                    (before > 0).then(|| (before, of.index(before), actual))
                })
                .collect();
            corrections.sort_by_key(|c| c.0);
            scenario.shared.corrections = corrections;
            scenario
        },
    )
}

/// For scenarios with corrections: the limits hold over the slots in use, each booking counted at
/// its cost after any correction that lowered it (the units given back were taken by later
/// events, so no window may be over); a raised cost is the partner's, counted as booked. A
/// correction applies to the message's booking when it is made, once: a new slot is a new booking.
pub fn check_corrected_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let scenario = Scenario { events: corrected_events(scenario, answers), ..scenario.clone() };
    if scenario.shared.budgets.is_empty() {
        check_pause_bounds(&scenario, answers)
    } else {
        check_budget_bounds(&scenario, answers)
    }
}

/// The scenario's events, each booking at its cost after any correction that lowered it
/// (`check_corrected_bounds`).
pub fn corrected_events(scenario: &Scenario, answers: &[Reservation]) -> Vec<Arrival> {
    let mut corrected: Vec<Arrival> = scenario.events.clone();
    let mut booking: HashMap<&str, usize> = HashMap::new();
    let mut done: Vec<bool> = vec![false; answers.len()];
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        for &(_, of, actual) in scenario.shared.corrections.iter().filter(|c| c.0 == i) {
            if let Some(&at) = booking.get(scenario.events[of].id.as_str())
                && !std::mem::replace(&mut done[at], true)
            {
                corrected[at].cost = actual.min(corrected[at].cost);
            }
        }
        if answer.replayed() {
            continue;
        }
        if answer.status == Status::Reserved {
            booking.insert(&arrival.id, i);
        } else {
            booking.remove(arrival.id.as_str());
        }
    }
    corrected
}

/// A rule with classes (two or three, `c0` and sometimes `c1` holding a reserve) over fixed limits,
/// sometimes adaptive (429s for keys lower their calendars' level), with or without shared budgets
/// (their floors, fair shares, pauses), pauses of keys, per-key overrides (of the key's calendar,
/// for every class), new slots for redeliveries and republished ids: each key's classes share its
/// calendar, each class its own FIFO. Sometimes the rule gains its classes at a later event: the
/// events before it are reserved by their keys (a backlog the keys' calendars take over).
pub fn scenario_with_classes(max_events: usize) -> impl Strategy<Value = Scenario> {
    let classes = (
        (2usize..=3, 150_000u64..=600_000, prop::option::weighted(0.5, 100_000u64..=300_000)),
        prop::option::weighted(0.4, adaptive()),
    );
    let picks = prop::collection::vec(0usize..3, max_events);
    let pauses = prop::collection::vec((any::<Index>(), 0..3usize, 0i64..3_000), 0..4);
    let changes = (pauses, override_ops(), prop::option::weighted(0.3, any::<Index>()));
    (scenario_with_budgets(max_events), prop::bool::weighted(0.3), classes, picks, changes).prop_map(
        |(mut scenario, keep_budgets, ((count, c0, c1), adaptive), picks, (pauses, overrides, added))| {
            if !keep_budgets {
                scenario.shared.budgets.clear();
                scenario.shared.budget_pauses.clear();
                scenario.shared.rules = 1;
            }
            // The rule's adaptive level is its keys' calendars' (signals for a key go there).
            scenario.shared.adaptive = None;
            scenario.shared.signals.retain(|s| s.1.is_some() || keep_budgets);
            scenario.overrides.clear();
            scenario.pauses.clear();
            let mut seen = std::collections::HashSet::new();
            let limits: Vec<Limit> = scenario
                .limits
                .iter()
                .filter(|l| seen.insert(l.per()))
                .map(|l| {
                    // Counts of 4 or more, so that reserves hold whole units.
                    let window = if matches!(l.window(), Window::Fixed(_)) {
                        l.window()
                    } else {
                        Window::Fixed(Placement::Start)
                    };
                    Limit::new(l.limit() + 3, l.per(), window).unwrap()
                })
                .collect();
            let smallest = limits.iter().map(Limit::limit).min().unwrap_or(1);
            // Arrivals five times as dense: backlogs that book ahead, where reserves matter.
            let start = scenario.events.first().map_or(0, |a| a.now);
            for arrival in &mut scenario.events {
                arrival.now = start + (arrival.now - start) / 5;
                arrival.published = start + (arrival.published - start) / 5;
            }
            // Pauses of a key (the downstream's answer to one of its classes) hold all its classes.
            let n = scenario.events.len();
            for (at, entity, lasts) in pauses {
                let before = at.index(n);
                scenario.pauses.push((before, entity, scenario.events[before].now + lasts));
            }
            scenario.pauses.sort_by_key(|p| p.0);
            for (arrival, pick) in scenario.events.iter_mut().zip(&picks) {
                arrival.cost = arrival.cost.min(smallest);
                if !arrival.redelivery {
                    arrival.class = pick % count;
                }
            }
            // A redelivery is the same message: the class of its first delivery.
            let first: HashMap<String, usize> =
                scenario.events.iter().filter(|a| !a.redelivery).map(|a| (a.id.clone(), a.class)).collect();
            for arrival in &mut scenario.events {
                arrival.class = first.get(&arrival.id).copied().unwrap_or(arrival.class);
            }
            if let Some(added) = added {
                let from = added.index(n);
                scenario.events[..from].iter_mut().for_each(|arrival| arrival.unclassed = true);
            }
            let floors = std::iter::once(("c0".to_owned(), c0)).chain(c1.map(|c1| ("c1".to_owned(), c1))).collect();
            let calendar = Arc::new(Budget {
                name: "classes".into(),
                limits: limits.clone(),
                max_share: None,
                adaptive,
                floors,
                per_key: true,
                fair: None,
                leases: None,
                tag: String::new(),
            });
            scenario.limits = limits;
            add_overrides(&mut scenario, overrides);
            scenario.shared.draws =
                std::iter::once(calendar.clone()).chain(scenario.shared.budgets.iter().cloned()).collect();
            scenario.shared.classes = Some(calendar);
            scenario
        },
    )
}

/// A rule with classes (as [`scenario_with_classes`]) that parks a throttled key's backlog: pauses
/// of keys and lowered calendars hold every class of the key, each class parks in its own queue,
/// and random drains book each class's queue of a key in turn. Sometimes the rule gains its
/// classes at a later event: what a key parked before (its budget paused or lowered) drains, once
/// the rule has classes, as the key's default class against its calendar.
pub fn scenario_with_parked_classes(max_events: usize) -> impl Strategy<Value = Scenario> {
    let drains = prop::collection::vec((any::<Index>(), 0..3usize, 0i64..2_000), 0..12);
    (scenario_with_classes(max_events), drains, 0i64..1_500).prop_map(|(mut scenario, drains, horizon)| {
        let n = scenario.events.len();
        scenario.shared.drains = drains.into_iter().map(|(at, entity, ahead)| (at.index(n), entity, ahead)).collect();
        scenario.shared.park = Some(horizon);
        scenario
    })
}

/// A rule with classes that parks (as [`scenario_with_parked_classes`]) drawing from a fair
/// budget (its first, with weights 1 to 4 for some keys): each class of a key parks past the
/// budget's near horizon in its own queue and waits in the ring as its own member.
pub fn scenario_with_fair_classes(max_events: usize) -> impl Strategy<Value = Scenario> {
    let weights = prop::collection::btree_map(0..3usize, 1u64..=4, 0..3);
    let with_budgets =
        scenario_with_parked_classes(max_events).prop_filter("a budget", |s| !s.shared.budgets.is_empty());
    (with_budgets, weights).prop_map(|(mut scenario, weights)| {
        let weights = weights.into_iter().map(|(entity, w)| (format!("entity_{entity}"), w)).collect();
        let fair = Some(drip_core::fair::Fair { weights });
        scenario.shared.budgets[0] = Arc::new(Budget { fair, ..(*scenario.shared.budgets[0]).clone() });
        let calendar = scenario.shared.classes.clone().expect("classes");
        scenario.shared.draws = std::iter::once(calendar).chain(scenario.shared.budgets.iter().cloned()).collect();
        scenario
    })
}

/// For scenarios with classes: per key and class, slots never go backwards; no slot decided
/// after a pause of its key lies before the pause's end, whatever its class; per key, every
/// window of each of the rule's limits holds at most its count over all classes; every budget
/// window at most its count.
pub fn check_class_bounds(scenario: &Scenario, answers: &[Reservation]) -> Result<(), String> {
    let mut in_use = InUse::default();
    let mut frontiers: HashMap<(usize, usize), Millis> = HashMap::new();
    let mut paused: HashMap<usize, Millis> = HashMap::new();
    for (i, (arrival, answer)) in scenario.events.iter().zip(answers).enumerate() {
        take_pauses(scenario, i, &mut paused);
        if answer.replayed() {
            continue;
        }
        // A pause is the key's calendar's: an event reserved before the rule had classes did not see it.
        let paused = paused.get(&arrival.entity).filter(|_| !arrival.unclassed);
        if answer.status == Status::Reserved && paused.is_some_and(|&until| answer.slot < until) {
            return Err(format!("{arrival:?} got {answer:?}, inside its key's pause"));
        }
        in_use.take(arrival, answer);
        if answer.status != Status::Reserved {
            continue;
        }
        // What a key reserved or parked before the rule had classes is its own FIFO.
        let class = if arrival.unclassed { usize::MAX } else { arrival.class };
        let last = frontiers.insert((arrival.entity, class), answer.slot);
        if last.is_some_and(|last| answer.slot < last) {
            return Err(format!("{arrival:?} got {answer:?}, before its class's previous slot"));
        }
    }
    let (ledgers, everyone) = in_use.sorted();
    for (entity, ledger) in &ledgers {
        // A key's override holds for all its classes; a window used under two counts holds at
        // most the larger.
        let limits: Vec<Limit> = scenario
            .limits
            .iter()
            .enumerate()
            .map(|(i, limit)| {
                let overridden = scenario.overrides.iter().filter(|o| o.entity == *entity && o.limit == i);
                let largest = overridden.filter_map(|o| o.set.map(|set| set.limit)).fold(limit.limit(), u64::max);
                Limit::new(largest, limit.per(), limit.window()).unwrap()
            })
            .collect();
        check_limits(&limits, ledger).map_err(|e| format!("entity {entity}, all classes: {e}"))?;
    }
    let largest_cost = scenario.events.iter().map(|e| e.cost).max().unwrap_or(1);
    for budget in &scenario.shared.budgets {
        check_limits(&budget.limits, &everyone).map_err(|e| format!("budget {}: {e}", budget.name))?;
        // A budget's fair share caps each key over all its classes (its calendar's).
        for (entity, ledger) in &ledgers {
            for limit in &budget.limits {
                if let Some(share) = budget.share_of(limit.limit(), largest_cost) {
                    let fair = Limit::new(share, limit.per(), Window::Fixed(Placement::Start)).unwrap();
                    check_limits(&[fair], ledger)
                        .map_err(|e| format!("key {entity}'s share of budget {}, all classes: {e}", budget.name))?;
                }
            }
        }
    }
    Ok(())
}
