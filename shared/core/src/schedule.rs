//! The reference model of slot reservation (docs/design.md: "Scheduling semantics"). No I/O: the caller
//! passes `now`. `lua/reserve.lua` implements exactly the same arithmetic; a differential test keeps
//! the two identical.
//!
//! For one entity (rule, key) the slot is the least common fixpoint, from `max(now, previous slot)`,
//! of each limit's "earliest time this limit accepts the event". Every such function is monotone and
//! never moves backwards, so iterating `t = max_i accept_i(t)` reaches that fixpoint, and because each
//! limit can push `t` forward at most once, in at most `limits + 1` rounds: O(limits) per event,
//! whatever the backlog.
//!
//! A shared budget is a calendar: a count per window, since events of many entities reserve its
//! windows out of order. Its "earliest window ≥ t with room" is monotone too, so the same fixpoint
//! holds; the search stops once `t` passes `now + max_delay` (the event is late either way).
//!
//! A calendar can be full far ahead (a backlog of many tenants), so the search must not walk it
//! window by window: each budget limit keeps one [`FullRun`], the consecutive full windows the
//! last searches walked, and a search that meets it jumps to its end. Each full window is then
//! walked about once, not once per event: a search walks only the windows between its start and
//! the run, past the run's end up to the first with room, and, when its cost fits beside what
//! the run's windows hold, the run itself (after which the run it records is one that cost cannot
//! fit beside).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use crate::budgets::{
    Adaptive, AdaptiveState, Budget, CalendarShare, LatencyOutcome, LatencyReport, LatencyState, adapted_count,
    adaptive_window, adaptive_window_count, calendar_shares,
};
use crate::rules::{LateEvents, Limit, Placement, Rule, Window};
use crate::time::Millis;

mod calendars;
mod entity;
mod fair;
mod leases;
mod overrides;
mod parking;
mod request;

pub use calendars::*;
pub use entity::*;
pub use leases::*;
pub use overrides::*;
pub use parking::*;
pub use request::*;

#[derive(Debug, Clone, Copy)]
struct Answer {
    slot: Millis,
    status: Status,
    decided_at: Millis,
    /// The cost it booked, and the cost reported after the call, once one was.
    cost: u64,
    corrected: Option<u64>,
    completed: bool,
    /// The attempt that took the lease acts alone until then.
    lease_until: Millis,
}

#[derive(Debug, Clone, Default)]
struct Entity {
    state: EntityState,
    answers: HashMap<AnswerFile, Answer>,
    /// Its parked messages, oldest first.
    queue: VecDeque<AnswerFile>,
}

/// Answers are filed by the minute of their message's publication (Redis keeps one hash per
/// minute, so that old answers expire together).
pub const ANSWER_MINUTE: Millis = 60_000;

/// Where a message's answer is filed: the minute it was published (`None`: undated) and its id.
pub type AnswerFile = (Option<Millis>, String);

fn answer_file(message_id: &str, published: Option<Millis>) -> AnswerFile {
    (published.map(|at| at.div_euclid(ANSWER_MINUTE)), message_id.to_owned())
}

/// The reference scheduler: every entity's state in memory.
#[derive(Debug, Clone, Default)]
pub struct Scheduler {
    entities: HashMap<(String, String), Entity>,
    budgets: HashMap<String, BudgetState>,
    /// By fair budget: its ring of waiting keys.
    rings: HashMap<String, fair::RingState>,
    /// The wake of its fair budget's ring a message that parked armed in the same step (taken by
    /// [`Scheduler::take_armed`]).
    armed: Option<Millis>,
}

/// Files a new decision as the message's answer (its lease taken by the attempt that asked): its
/// reservation.
fn file_decision(entity: &mut Entity, request: &ReserveRequest<'_>, slot: Millis, status: Status) -> Reservation {
    let answer = Answer {
        slot,
        status,
        decided_at: request.now,
        cost: request.cost,
        corrected: None,
        completed: false,
        lease_until: request.now + request.lease,
    };
    entity.answers.insert(answer_file(request.message_id, request.published), answer);
    Reservation { slot, status, decided_at: request.now, attempt: Attempt::Decided }
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// The wake of its fair budget's ring the last reservation armed as its message parked (the
    /// caller makes the wake's task), or `None`; taking it clears it.
    pub fn take_armed(&mut self) -> Option<Millis> {
        self.armed.take()
    }

    pub fn reserve(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>) -> Reservation {
        self.carry_over(rule, request);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        if let Some(answer) = entity.answers.get_mut(&answer_file(request.message_id, request.published)) {
            let attempt = if answer.completed {
                Attempt::Done
            } else if answer.lease_until > request.now {
                Attempt::Busy
            } else {
                answer.lease_until = request.now + request.lease;
                Attempt::Resumed
            };
            let Answer { slot, status, decided_at, .. } = *answer;
            return Reservation { slot, status, decided_at, attempt };
        }
        if request.park.is_some() && entity.state.parked > 0 {
            return self.park_behind(rule, key, request);
        }
        self.decide(rule, key, request, None)
    }

    /// Reserves a new slot for a message that already has one (the attempt holding its lease was
    /// told to wait by the downstream, found a pause, or came too late): the earliest slot now,
    /// after any pause, replaces the answer. `old` says whether the old slot's units go back first
    /// (see [`give_back`] for where they can).
    pub fn reslot(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>, old: OldSlot) -> Reservation {
        self.carry_over(rule, request);
        // A parked message has no slot to move: its key's drain gives it one.
        let entity = self.entities.get(&(rule.to_owned(), key.to_owned()));
        let file = answer_file(request.message_id, request.published);
        if entity.and_then(|e| e.answers.get(&file)).is_some_and(|a| a.status == Status::Parked) {
            return self.reserve(rule, key, request);
        }
        let given_back = match old {
            OldSlot::Kept => None,
            OldSlot::GivenBack => self
                .entities
                .get(&(rule.to_owned(), key.to_owned()))
                .and_then(|e| e.answers.get(&answer_file(request.message_id, request.published)))
                .filter(|a| a.status == Status::Reserved)
                .map(|a| (a.slot, a.corrected.unwrap_or(a.cost), a.decided_at)),
        };
        self.decide(rule, key, request, given_back)
    }

    /// A cost reported after the call (`actual`) corrects what the message's reservation booked, once:
    /// more is charged to its slot's windows (later slots of the key and its budgets move out),
    /// less given back where it can be ([`give_back`]'s rules); never below zero. `request` names
    /// the message and the rule's limits and budgets at `now` (its cost is not read).
    pub fn correct(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>, actual: u64) -> Correction {
        let Some(entity) = self.entities.get_mut(&(rule.to_owned(), key.to_owned())) else {
            return Correction::Unknown;
        };
        let Some(answer) = entity.answers.get_mut(&answer_file(request.message_id, request.published)) else {
            return Correction::Unknown;
        };
        if answer.status != Status::Reserved {
            return Correction::Unknown;
        }
        if answer.corrected.is_some() {
            return Correction::Already;
        }
        let (slot, booked, decided_at) = (answer.slot, answer.cost, answer.decided_at);
        answer.corrected = Some(actual);
        self.carry_over(rule, request);
        let Some(entity) = self.entities.get_mut(&(rule.to_owned(), key.to_owned())) else {
            return Correction::Unknown;
        };
        let unit = ReserveRequest { cost: 1, ..*request };
        let shared = budget_limits(&self.budgets, &unit, (rule, key));
        let (_, own) = entity_limits(&entity.state, &unit, &shared);
        let moved = (request.now, slot, actual.abs_diff(booked));
        let charged = charged_by(&entity.state, &unit, &shared, decided_at);
        if actual < booked {
            give_back(&mut entity.state, &mut self.budgets, moved, &own, &charged);
        } else if actual > booked {
            charge(&mut entity.state, &mut self.budgets, moved, &own, &charged);
        }
        Correction::Applied { booked, actual }
    }

    /// No slot of the entity before `until` (a later pause extends it, an earlier one changes nothing).
    pub fn pause(&mut self, rule: &str, key: &str, until: Millis) {
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        entity.state.paused_until = Some(entity.state.paused_until.map_or(until, |p| p.max(until)));
    }

    /// No slot of any entity drawing from the budget before `until`.
    pub fn pause_budget(&mut self, budget: &str, until: Millis) {
        let state = self.budgets.entry(budget.to_owned()).or_default();
        state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
    }

    /// Lifts the entity's pause (an operator's resume); returns when it would have ended. Slots
    /// already reserved keep their times; the next reservation is no longer held back by it.
    pub fn resume(&mut self, rule: &str, key: &str) -> Option<Millis> {
        let entity = self.entities.get_mut(&(rule.to_owned(), key.to_owned()))?;
        entity.state.paused_until.take()
    }

    /// Lifts the budget's pause; returns when it would have ended.
    pub fn resume_budget(&mut self, budget: &str) -> Option<Millis> {
        self.budgets.get_mut(budget)?.paused_until.take()
    }

    /// The downstream of an entity with an adaptive limit answered 429, 5xx or timed out at `now`;
    /// returns the level after it (ppm).
    pub fn signal(&mut self, rule: &str, key: &str, adaptive: &Adaptive, limits: &[Limit], now: Millis) -> u64 {
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let after = adaptive.signal(entity.state.adaptive, adaptive_window(limits), now);
        entity.state.adaptive = Some(after);
        after.level
    }

    /// The same for a budget; nothing for a budget without an adaptive limit.
    pub fn signal_budget(&mut self, budget: &Budget, now: Millis) -> Option<u64> {
        let adaptive = budget.adaptive?;
        let state = self.budgets.entry(budget.name.clone()).or_default();
        let after = adaptive.signal(state.adaptive, adaptive_window(&budget.limits), now);
        state.adaptive = Some(after);
        adopt_level(&mut self.budgets, budget, now);
        Some(after.level)
    }

    /// A window's latency of an entity's downstream, reported at `now` (see
    /// [`Adaptive::after_latency`]); `None` when its adaptive limit does not follow latency.
    pub fn report_latency(
        &mut self,
        (rule, key): (&str, &str),
        (adaptive, limits): (&Adaptive, &[Limit]),
        report: LatencyReport,
        now: Millis,
    ) -> Option<LatencyOutcome> {
        adaptive.latency?;
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let target = (adaptive_window_count(limits), adaptive_window(limits));
        let outcome = adaptive.after_latency((entity.state.adaptive, entity.state.latency), report, target, now)?;
        entity.state.latency = Some(outcome.latency);
        if let Some(level) = outcome.adaptive {
            entity.state.adaptive = Some(level);
        }
        Some(outcome)
    }

    /// The same for a budget.
    pub fn report_budget_latency(
        &mut self,
        budget: &Budget,
        report: LatencyReport,
        now: Millis,
    ) -> Option<LatencyOutcome> {
        let adaptive = budget.adaptive.filter(|a| a.latency.is_some())?;
        let state = self.budgets.entry(budget.name.clone()).or_default();
        let target = (adaptive_window_count(&budget.limits), adaptive_window(&budget.limits));
        let outcome = adaptive.after_latency((state.adaptive, state.latency), report, target, now)?;
        state.latency = Some(outcome.latency);
        if let Some(level) = outcome.adaptive {
            state.adaptive = Some(level);
            adopt_level(&mut self.budgets, budget, now);
        }
        Some(outcome)
    }

    pub fn budget_state(&self, budget: &str) -> Option<&BudgetState> {
        self.budgets.get(budget)
    }

    /// A classes calendar met for the first time takes over what its key booked before the rule
    /// had classes (the key's own state, `(rule, key)`), so that adding classes to a rule with a
    /// backlog keeps every window exact: each window of the rule's limits that has not closed
    /// holds what the key's state holds of it (a fixed limit's state is its latest window: the
    /// only one the classes can share with that backlog; a fair share's, for a period only the
    /// share counts), and the key's last slot becomes every
    /// class's floor ([`Self::with_carried_floor`]). Once per calendar: it records what it took.
    fn carry_over(&mut self, rule: &str, request: &ReserveRequest<'_>) {
        let Some((scope, _)) = request.class else { return };
        let Some(calendar) = request.budgets.iter().find(|b| b.per_key) else { return };
        let state = self.budgets.entry(calendar.state_name(Some(scope))).or_default();
        if state.carried.is_some() {
            return;
        }
        let before = self.entities.get(&(rule.to_owned(), scope.to_owned())).map(|e| &e.state);
        state.carried = Some(before.and_then(|s| s.last_slot).unwrap_or(0));
        // The calendar's limits, then each period only a fair share counts.
        let own = calendar.limits.iter().map(|l| (l.per(), state_id(l)));
        let shares = calendar_shares(calendar, request.budgets).into_iter().filter(|s| s.counts);
        for (per, id) in own.chain(shares.map(|s| (s.per, s.id))) {
            if let Some(&LimitState::Fixed { window, used }) = before.and_then(|s| s.limits.get(&id))
                && window + per > request.now
                && used > 0
            {
                *state.windows.entry((per, window)).or_default() += used;
            }
        }
    }

    /// The request with its floor raised to what its key's classes calendar carried over.
    fn with_carried_floor<'a>(&self, request: &ReserveRequest<'a>) -> ReserveRequest<'a> {
        let carried = request.class.and_then(|(scope, _)| {
            let calendar = request.budgets.iter().find(|b| b.per_key)?;
            self.budgets.get(&calendar.state_name(Some(scope)))?.carried.filter(|&slot| slot > 0)
        });
        ReserveRequest { floor: request.floor.max(carried), ..*request }
    }

    /// A fresh decision for the request's message: its slot reserved (or why not) and its answer
    /// filed, after the units of `given_back` (a slot, the cost it booked and when it was decided)
    /// went back (unless the cost is over a count in force).
    fn decide(
        &mut self,
        rule: &str,
        key: &str,
        request: &ReserveRequest<'_>,
        given_back: Option<(Millis, u64, Millis)>,
    ) -> Reservation {
        let request = &self.with_carried_floor(request);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let shared = budget_limits(&self.budgets, request, (rule, key));
        let (exceeded, own) = entity_limits(&entity.state, request, &shared);
        if let Some((old, cost, decided_at)) = given_back.filter(|_| !exceeded) {
            let charged = charged_by(&entity.state, request, &shared, decided_at);
            give_back(&mut entity.state, &mut self.budgets, (request.now, old, cost), &own, &charged);
        }
        let slot = if exceeded {
            request.now
        } else {
            search(&entity.state, &mut self.budgets, request, (&own, &shared), None)
        };
        let status = if exceeded {
            Status::CostExceedsLimit
        } else if slot > request.now + request.max_delay {
            Status::MaxDelayExceeded
        } else if parks(&entity.state, throttled_budget(&self.budgets, request, &shared), request, slot) {
            self.armed = queue(entity, &mut self.rings, (rule, key), request, slot);
            Status::Parked
        } else {
            commit(&mut entity.state, request, &own, slot);
            for l in shared.iter().filter(|l| l.counts()) {
                let BudgetLimit { budget, limit, member, state, .. } = l;
                let (state, per) = (self.budgets.entry(state.clone()).or_default(), limit.per());
                let window = slot.div_euclid(per) * per;
                if l.partition().is_some() {
                    // A pool keeps no window before now's (reserve.lua drops them here too).
                    let current = request.now.div_euclid(per) * per;
                    state.windows.retain(|&(p, w), _| p != per || w >= current);
                    state.leased.retain(|&(p, w), _| p != per || w >= current);
                    state.returned.retain(|&(p, w), _| p != per || w >= current);
                }
                *state.windows.entry((per, window)).or_default() += request.cost;
                if !l.is_share() && budget.floors.iter().any(|(floor, _)| floor == member) {
                    *state.floor_used.entry((per, window, (*member).to_owned())).or_default() += request.cost;
                }
            }
            give_up_short_leases(&mut self.budgets, &shared, (request.now, slot));
            Status::Reserved
        };
        file_decision(entity, request, slot, status)
    }

    /// Whether the request's cost is over a count in force, and the slot its entity would give it
    /// now (the runs its search walked are kept; nothing else changes); a leased budget's home is
    /// asked for no window past `lease_through` ([`search`]).
    fn earliest(
        &mut self,
        rule: &str,
        key: &str,
        request: &ReserveRequest<'_>,
        lease_through: Option<Millis>,
    ) -> (bool, Millis) {
        self.carry_over(rule, request);
        let request = &self.with_carried_floor(request);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let shared = budget_limits(&self.budgets, request, (rule, key));
        let (exceeded, own) = entity_limits(&entity.state, request, &shared);
        if exceeded {
            return (true, request.now);
        }
        (false, search(&entity.state, &mut self.budgets, request, (&own, &shared), lease_through))
    }

    fn answer_mut(&mut self, rule: &str, key: &str, (id, published): (&str, Option<Millis>)) -> Option<&mut Answer> {
        let entity = self.entities.get_mut(&(rule.to_owned(), key.to_owned()))?;
        entity.answers.get_mut(&answer_file(id, published))
    }

    /// Records that the message was acted upon (forwarded, scheduled or dead-lettered).
    /// `message` is the message's id and publish time, as its reservation named them.
    pub fn complete(&mut self, rule: &str, key: &str, message: (&str, Option<Millis>)) {
        if let Some(answer) = self.answer_mut(rule, key, message) {
            answer.completed = true;
        }
    }

    /// Ends the lease of an attempt that failed, so that a retry may act at once.
    pub fn release(&mut self, rule: &str, key: &str, message: (&str, Option<Millis>)) {
        if let Some(answer) = self.answer_mut(rule, key, message) {
            answer.lease_until = 0;
        }
    }

    /// How many of the entity's events hold a slot after `now`: its backlog, exactly (each
    /// reserved event's answer names its slot).
    /// The slots of the entity's reserved events that lie at or after `since`, in no order.
    pub fn reserved_slots(&self, rule: &str, key: &str, since: Millis) -> Vec<Millis> {
        let Some(entity) = self.entities.get(&(rule.to_owned(), key.to_owned())) else { return Vec::new() };
        entity.answers.values().filter(|a| a.status == Status::Reserved && a.slot >= since).map(|a| a.slot).collect()
    }

    /// Every entity of `rule` the model holds, with its last slot if it has one.
    pub fn entities_of<'a>(&'a self, rule: &'a str) -> impl Iterator<Item = (&'a str, Option<Millis>)> + 'a {
        self.entities.iter().filter(move |((r, _), _)| r == rule).map(|((_, key), e)| (key.as_str(), e.state.last_slot))
    }

    pub fn entity_state(&self, rule: &str, key: &str) -> Option<&EntityState> {
        self.entities.get(&(rule.to_owned(), key.to_owned())).map(|e| &e.state)
    }

    /// Sets (or replaces) an entity's override of the limit named `id` ([`override_id`]); returns
    /// the one it replaced.
    pub fn set_override(&mut self, rule: &str, key: &str, id: &str, set: LimitOverride) -> Option<LimitOverride> {
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        entity.state.overrides.insert(id.to_owned(), set)
    }

    /// Removes an entity's override; returns it.
    pub fn delete_override(&mut self, rule: &str, key: &str, id: &str) -> Option<LimitOverride> {
        let entity = self.entities.get_mut(&(rule.to_owned(), key.to_owned()))?;
        entity.state.overrides.remove(id)
    }

    /// Sets (`Some`) or removes (`None`) a classes calendar's override of the rule's limit named
    /// `id`, for every class of its key (`calendar`: [`Budget::state_name`] of the key); returns
    /// the one it replaced.
    pub fn change_calendar_override(
        &mut self,
        calendar: &str,
        id: &str,
        set: Option<LimitOverride>,
    ) -> Option<LimitOverride> {
        let overrides = &mut self.budgets.entry(calendar.to_owned()).or_default().overrides;
        match set {
            Some(set) => overrides.insert(id.to_owned(), set),
            None => overrides.remove(id),
        }
    }
}

/// The entity's earliest slot ([`earliest_slot`]), each leased budget's home asked for a lease
/// where its pool has none, and the runs of full windows the search walked kept.
///
/// A drain's search (`lease_through`: its deadline) leases only windows it may book now: its home
/// walks no window past the deadline, and where a pool is short in a window past it the search
/// stops there (that window is a lower bound of the slot, and the head stays), so a busy
/// partition's drain never takes a window ahead before the partitions whose keys arrive meanwhile
/// have asked for it.
fn search(
    state: &EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    request: &ReserveRequest<'_>,
    (own, shared): (&[EntityLimit], &[BudgetLimit<'_>]),
    lease_through: Option<Millis>,
) -> Millis {
    let (slot, runs) = loop {
        match earliest_slot(state, budgets, request, own, shared) {
            Ok(found) => break found,
            Err(wanted) if lease_through.is_some_and(|through| wanted.window > through) => return wanted.window,
            Err(wanted) => lease(budgets, &shared[wanted.limit], request, (wanted.window, lease_through)),
        }
    };
    for ((state, per), run) in runs {
        budgets.entry(state).or_default().runs.insert(per, run);
    }
    slot
}

/// A budget limit's run of full windows after a search: (budget state name, per) and the run.
type WalkedRun = ((String, Millis), FullRun);

/// The slot the next event of this entity would get, and the runs of full windows its search
/// walked, by budget and per (nothing is changed).
fn earliest_slot<'a>(
    state: &EntityState,
    budgets: &HashMap<String, BudgetState>,
    request: &ReserveRequest<'_>,
    own: &[EntityLimit],
    shared: &[BudgetLimit<'a>],
) -> Result<(Millis, Vec<WalkedRun>), LeaseWanted> {
    // A share that books nothing (a calendar limit of its period counts its windows) keeps no run.
    let mut runs: Vec<Option<FullRun>> = shared
        .iter()
        .map(|l| budgets.get(&l.state).filter(|_| l.counts()).and_then(|s| s.runs.get(&l.limit.per()).copied()))
        .collect();
    let frontier = frontier(state, request);
    let mut t = frontier.map_or(request.now, |last| last.max(request.now));
    let pauses = shared.iter().filter_map(|l| budgets.get(l.home()).and_then(|s| s.paused_until));
    t = state.paused_until.into_iter().chain(pauses).fold(t, Millis::max);
    loop {
        let mut next = own
            .iter()
            .map(|l| {
                let held = state.limits.get(&l.id);
                earliest_accepted(&l.limit, (l.count, held), frontier, (request.cost, request.margin), t)
            })
            .fold(t, Millis::max);
        for (i, (l, run)) in shared.iter().zip(&mut runs).enumerate() {
            let accepted = if l.partition().is_some() {
                pool_accepts(budgets.get(&l.state), l, request, t).map_err(|window| LeaseWanted { limit: i, window })?
            } else {
                let accepted;
                (accepted, *run) = budget_accepts(budgets.get(&l.state), *run, l, request, t);
                accepted
            };
            next = next.max(accepted);
        }
        if next == t {
            let walked = shared
                .iter()
                .zip(runs)
                .filter(|(l, _)| l.counts())
                .filter_map(|(l, run)| Some(((l.state.clone(), l.limit.per()), run?)));
            return Ok((t, walked.collect()));
        }
        t = next;
    }
}

/// The earliest time ≥ `t` at which this one limit, with `n` in force, accepts `cost` more.
///
/// A limit with no state in an entity that has a frontier (`frontier`: its last slot) is one the
/// rule gained by an edit (a new limit, or a changed period, kind or GCRA count): what the old
/// limits let through up to the frontier is unknown to it, so it counts as full up to the frontier
/// (fixed: the frontier's window; sliding: `per` after it; gcra: one interval after it). New events
/// then never share a window of the new limit with the old backlog.
fn earliest_accepted(
    limit: &Limit,
    (n, state): (u64, Option<&LimitState>),
    frontier: Option<Millis>,
    (cost, margin): (u64, Millis),
    t: Millis,
) -> Millis {
    let per = limit.per();
    match limit.window() {
        Window::Fixed(placement) => {
            let (window, t) = outside_margin(t, per, margin);
            let used = match (state, frontier) {
                (Some(LimitState::Fixed { window: w, used }), _) if *w == window => *used,
                (None, Some(last)) if last.div_euclid(per) * per == window => n,
                _ => 0,
            };
            if used + cost > n {
                window + per
            } else if placement == Placement::Spread {
                t.max(spread_position(window, used, per - margin, n))
            } else {
                t
            }
        }
        Window::Sliding => match state {
            Some(LimitState::Sliding { base, entries }) => {
                let total = entries.back().map_or(*base, |&(_, cum)| cum);
                // Drop the oldest slots until what is left leaves room for `cost`.
                let threshold = total as i64 - (n - cost) as i64;
                if threshold <= *base as i64 {
                    t
                } else {
                    let first_kept = entries.partition_point(|&(_, cum)| (cum as i64) < threshold);
                    t.max(entries[first_kept].0 + per + margin)
                }
            }
            None => frontier.map_or(t, |last| t.max(last + per + margin)),
            _ => t,
        },
        Window::Gcra { burst } => match state {
            Some(LimitState::Gcra { tat, tat_rem }) => {
                // An event of cost c waits until c units conform: TAT − (burst − c)·T.
                let x = *tat_rem as i64 - (burst as i64 - cost as i64) * per;
                let allowed = tat + x.div_euclid(n as i64) + i64::from(x.rem_euclid(n as i64) > 0);
                t.max(allowed)
            }
            None => frontier.map_or(t, |last| t.max(last + (per as u64).div_ceil(n) as i64)),
            _ => t,
        },
    }
}

/// The window of `t` and `t` itself, or, when `t` lies in the window's last `margin`, the next
/// window and its start: a delivery up to `margin` late still lands in its slot's window.
fn outside_margin(t: Millis, per: Millis, margin: Millis) -> (Millis, Millis) {
    let window = t.div_euclid(per) * per;
    if t >= window + per - margin { (window + per, window + per) } else { (window, t) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{HOUR, MINUTE, SECOND};

    fn limit(limit: u64, per: Millis, window: Window) -> Limit {
        Limit::new(limit, per, window).unwrap()
    }

    pub(super) fn request<'a>(id: &'a str, limits: &'a [Limit], now: Millis) -> ReserveRequest<'a> {
        ReserveRequest::new(id, limits, now)
    }

    fn run(limits: &[Limit], arrivals: &[(Millis, u64)]) -> Vec<Millis> {
        let mut s = Scheduler::new();
        arrivals
            .iter()
            .enumerate()
            .map(|(i, &(now, cost))| {
                let id = format!("m{i}");
                let r = ReserveRequest { cost, max_delay: 1_000 * MINUTE, ..request(&id, limits, now) };
                s.reserve("r", "k", &r).slot
            })
            .collect()
    }

    #[test]
    fn a_delivery_is_late_once_it_leaves_its_slot_s_window_or_margin() {
        let fixed = [limit(10, SECOND, Window::Fixed(Placement::Start))];
        let request = request("m", &fixed, 0);
        assert!(!request.delivery_is_late(1_200, 1_999), "the same window");
        assert!(request.delivery_is_late(1_200, 2_000), "the next window");
        let gcra = [limit(10, SECOND, Window::Gcra { burst: 1 })];
        let request = ReserveRequest { margin: 2 * SECOND, ..super::tests::request("m", &gcra, 0) };
        assert!(!request.delivery_is_late(1_200, 3_200), "within the margin");
        assert!(request.delivery_is_late(1_200, 3_201), "past it");
        let request = super::tests::request("m", &gcra, 0);
        assert!(!request.delivery_is_late(1_200, 1_200 + DISPATCH_JITTER), "a dispatch's jitter is not late");
        assert!(request.delivery_is_late(1_200, 1_201 + DISPATCH_JITTER));
    }

    /// A message given a new slot with its old one given back: the units return to the window
    /// the entity holds and to the budget's, so the window takes another event; kept, they do not.
    #[test]
    fn a_new_slot_gives_the_old_one_s_units_back_when_asked() {
        let limits = [limit(2, SECOND, Window::Fixed(Placement::Start))];
        for (old, slot, held) in [(OldSlot::GivenBack, 100, (0, 2)), (OldSlot::Kept, SECOND, (SECOND, 1))] {
            let mut s = Scheduler::new();
            assert_eq!(s.reserve("r", "k", &request("a", &limits, 0)).slot, 0);
            assert_eq!(s.reserve("r", "k", &request("b", &limits, 0)).slot, 0);
            // "a" was never delivered: it asks again at 100 ms.
            assert_eq!(s.reslot("r", "k", &request("a", &limits, 100), old).slot, slot, "{old:?}");
            let state = s.entity_state("r", "k").unwrap().limits.values().next().cloned();
            assert_eq!(state, Some(LimitState::Fixed { window: held.0, used: held.1 }), "{old:?}");
        }
    }

    /// A cost known only after the call corrects what was booked, once: more moves the next slot
    /// out, less gives units back to a window still open.
    #[test]
    fn a_cost_reported_after_the_call_corrects_the_booking_once() {
        let limits = [limit(4, SECOND, Window::Fixed(Placement::Start))];
        let mut s = Scheduler::new();
        let estimate = |id, now| ReserveRequest { cost: 2, ..request(id, &limits, now) };
        assert_eq!(s.reserve("r", "k", &estimate("a", 0)).slot, 0);
        // "a" really cost 4: the window is over by 2, so the next event waits for the next one.
        assert_eq!(s.correct("r", "k", &request("a", &limits, 10), 4), Correction::Applied { booked: 2, actual: 4 });
        assert_eq!(s.correct("r", "k", &request("a", &limits, 11), 1), Correction::Already, "once per message");
        assert_eq!(s.reserve("r", "k", &request("b", &limits, 20)).slot, SECOND);
        // "b" was booked at 1 and cost nothing: the window it holds gets it back.
        assert_eq!(s.correct("r", "k", &request("b", &limits, 30), 0), Correction::Applied { booked: 1, actual: 0 });
        let state = s.entity_state("r", "k").unwrap().limits.values().next().cloned();
        assert_eq!(state, Some(LimitState::Fixed { window: SECOND, used: 0 }));
        assert_eq!(s.correct("r", "k", &request("never", &limits, 30), 2), Correction::Unknown);
    }

    #[test]
    fn a_throttled_key_parks_its_backlog_and_the_drain_books_it_at_the_rate_then() {
        let limits = [limit(10, SECOND, Window::Fixed(Placement::Start))];
        let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 100_000, step: 100_000, latency: None };
        let limits = &limits;
        let request = move |id: &'static str, now| ReserveRequest {
            park: Some(2 * SECOND),
            adaptive: Some(adaptive),
            ..ReserveRequest::new(id, limits, now)
        };
        let ids: Vec<&'static str> = (0..30).map(|i| &*format!("early{i}").leak()).collect();
        let parked_ids: Vec<&'static str> = (0..20).map(|i| &*format!("p{i}").leak()).collect();
        let mut s = Scheduler::new();
        // Not throttled: a slot past the horizon is booked as ever.
        for id in &ids {
            assert_eq!(s.reserve("r", "k", &request(id, 0)).status, Status::Reserved);
        }
        // Throttled (a 429 halved the level): what would wait past 2 s parks, in order.
        s.signal("r", "k", &adaptive, limits, 100);
        let parked = s.reserve("r", "k", &request("p0", 200));
        assert_eq!((parked.status, parked.slot), (Status::Parked, 3_000));
        assert_eq!(s.arm_wake("r", "k", 200, 1_000), Some(1_000));
        assert_eq!(s.arm_wake("r", "k", 300, 1_000), None, "one wake armed at a time");
        for id in &parked_ids[1..] {
            assert_eq!(s.reserve("r", "k", &request(id, 300)).status, Status::Parked);
        }
        assert_eq!(s.entity_state("r", "k").unwrap().parked, 20);
        assert_eq!(s.parked("r", "k")[..2], [(None, "p0".into()), (None, "p1".into())]);
        // A redelivery gets its answer; only the head can be drained.
        assert_eq!(s.reserve("r", "k", &request("p3", 400)).status, Status::Parked);
        assert_eq!(s.unpark("r", "k", &request("p1", 1_000), 3_000), Unpark::NotHead);
        assert_eq!(s.unpark("r", "k", &request("early0", 1_000), 3_000), Unpark::NotParked);
        // The drain at 1 s: the head's slot, 3 s, is past the deadline.
        assert_eq!(s.unpark("r", "k", &request("p0", 1_000), 2_000), Unpark::Later { slot: 3_000, wake: 2_000 });
        assert_eq!(s.entity_state("r", "k").unwrap().wake, Some(2_000));
        // At 3 s the level has grown back (a step a quiet second) to 0.7: 7 a second.
        assert_eq!(adaptive.level(s.entity_state("r", "k").unwrap().adaptive, SECOND, 3_000), 700_000);
        let mut slots = Vec::new();
        for id in &parked_ids {
            match s.unpark("r", "k", &request(id, 3_000), 4_500) {
                Unpark::Decided(r) => {
                    assert_eq!(r.status, Status::Reserved);
                    slots.push(r.slot);
                }
                Unpark::Later { slot, wake } => {
                    assert_eq!((slot, wake), (5_000, 3_500));
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        // The drain books 7 a second (the level at its now), from the frontier on, in order.
        assert_eq!(slots, [[3_000; 7], [4_000; 7]].concat());
        assert_eq!(s.entity_state("r", "k").unwrap().parked, 6);
        // Nothing parked once the queue is empty: a new event books (the level back at its ceiling).
        for id in &parked_ids[slots.len()..] {
            assert!(matches!(s.unpark("r", "k", &request(id, 60_000), 62_000), Unpark::Decided(_)));
        }
        let state = s.entity_state("r", "k").unwrap();
        assert_eq!((state.parked, state.wake), (0, None));
        assert_eq!(s.reserve("r", "k", &request("after", 60_000)).status, Status::Reserved);
    }

    #[test]
    fn a_drain_behind_a_long_pause_wakes_at_least_every_max_wake_gap() {
        let limits = [limit(1, SECOND, Window::Fixed(Placement::Start))];
        let request =
            |id, now| ReserveRequest { park: Some(SECOND), max_delay: HOUR, ..ReserveRequest::new(id, &limits, now) };
        let mut s = Scheduler::new();
        s.pause("r", "k", 10 * MINUTE);
        assert_eq!(s.reserve("r", "k", &request("a", 0)).status, Status::Parked);
        assert_eq!(s.arm_wake("r", "k", 0, 10 * MINUTE - SECOND), Some(MAX_WAKE_GAP));
        let later = s.unpark("r", "k", &request("a", MAX_WAKE_GAP), MAX_WAKE_GAP + SECOND);
        assert_eq!(later, Unpark::Later { slot: 10 * MINUTE, wake: 2 * MAX_WAKE_GAP });
        // The pause lifted early: the next wake books it at once.
        s.resume("r", "k");
        let Unpark::Decided(a) = s.unpark("r", "k", &request("a", 2 * MAX_WAKE_GAP), 2 * MAX_WAKE_GAP + SECOND) else {
            panic!()
        };
        assert_eq!((a.status, a.slot), (Status::Reserved, 2 * MAX_WAKE_GAP));
    }

    #[test]
    fn a_message_parked_past_its_max_delay_leaves_the_queue_with_nothing_reserved() {
        let limits = [limit(1, SECOND, Window::Fixed(Placement::Start))];
        let limits = &limits;
        let request = move |id: &'static str, now| ReserveRequest {
            park: Some(SECOND),
            max_delay: 10 * SECOND,
            ..ReserveRequest::new(id, limits, now)
        };
        let mut s = Scheduler::new();
        s.pause("r", "k", 5_000);
        assert_eq!(s.reserve("r", "k", &request("a", 0)).status, Status::Parked);
        assert_eq!(s.reserve("r", "k", &request("b", 9_000)).status, Status::Parked, "behind a parked one");
        let Unpark::Decided(a) = s.unpark("r", "k", &request("a", 11_000), 12_000) else { panic!() };
        assert_eq!(a.status, Status::MaxDelayExceeded);
        let Unpark::Decided(b) = s.unpark("r", "k", &request("b", 11_000), 12_000) else { panic!() };
        assert_eq!((b.status, b.slot), (Status::Reserved, 11_000));
        assert_eq!(s.reserve("r", "k", &request("a", 11_500)).status, Status::MaxDelayExceeded, "its answer stays");
    }

    #[test]
    fn seed_example_drips_into_the_next_minutes() {
        let t0 = 1_785_758_400_000; // 2026-08-03T12:00:00Z
        let limits = [limit(100, MINUTE, Window::Fixed(Placement::Start))];
        let slots = run(&limits, &vec![(t0 + SECOND, 1); 500]);
        for (minute, chunk) in slots.chunks(100).enumerate() {
            let expected = if minute == 0 { t0 + SECOND } else { t0 + minute as i64 * MINUTE };
            assert!(chunk.iter().all(|&s| s == expected), "minute {minute}: {chunk:?}");
        }
    }

    #[test]
    fn spread_spaces_a_window_evenly() {
        let limits = [limit(4, 4 * SECOND, Window::Fixed(Placement::Spread))];
        assert_eq!(run(&limits, &[(0, 1); 6]), [0, 1_000, 2_000, 3_000, 4_000, 5_000]);
    }

    #[test]
    fn sliding_waits_for_the_oldest_slot_to_leave() {
        let limits = [limit(2, 10 * SECOND, Window::Sliding)];
        let slots = run(&limits, &[(0, 1), (4_000, 1), (5_000, 1), (5_000, 1), (5_000, 2)]);
        assert_eq!(slots, [0, 4_000, 10_000, 14_000, 24_000]);
    }

    #[test]
    fn gcra_allows_a_burst_then_one_per_interval_and_cost_waits_until_its_units_conform() {
        let limits = [limit(3, 3 * SECOND, Window::Gcra { burst: 2 })];
        assert_eq!(run(&limits, &[(0, 1); 5]), [0, 0, 1_000, 2_000, 3_000]);
        // Cost c goes once c units conform (TAT − (burst − c)·T), never more than `burst` at once.
        assert_eq!(run(&limits, &[(0, 2), (0, 1), (0, 1)]), [0, 1_000, 2_000]);
        assert_eq!(run(&limits, &[(0, 1), (0, 2), (0, 1)]), [0, 1_000, 2_000]);
        let two = [limit(2, SECOND, Window::Gcra { burst: 2 })];
        assert_eq!(run(&two, &[(0, 1), (0, 2)]), [0, 500]);
        let thirds = [limit(3, SECOND, Window::Gcra { burst: 1 })];
        assert_eq!(run(&thirds, &[(0, 1); 4]), [0, 334, 667, 1_000]);
    }

    #[test]
    fn a_cost_above_a_gcra_burst_can_never_conform() {
        let limits = [limit(10, SECOND, Window::Gcra { burst: 2 })];
        let mut s = Scheduler::new();
        let request = ReserveRequest { cost: 3, ..request("big", &limits, 0) };
        assert_eq!(s.reserve("r", "k", &request).status, Status::CostExceedsLimit);
        assert_eq!(s.entity_state("r", "k").and_then(|e| e.last_slot), None, "nothing reserved");
    }

    #[test]
    fn answers_are_filed_by_id_and_minute_of_publication() {
        let limits = [limit(1, MINUTE, Window::Fixed(Placement::Start))];
        let mut s = Scheduler::new();
        let at = |id: &'static str, now: Millis, published: Option<Millis>| ReserveRequest {
            published,
            max_delay: 10 * MINUTE,
            ..request(id, &limits, now)
        };
        // m1 published at 12:00:59 and an m1 published at 12:01:00 are filed apart, as in Redis.
        let (t0, t1, t2) = (59 * SECOND, MINUTE, MINUTE + SECOND);
        let slots: Vec<_> = [at("m1", t0, Some(t0)), at("m1", t1, Some(t1)), at("m2", t2, Some(t2))]
            .iter()
            .map(|r| s.reserve("r", "k", r).slot)
            .collect();
        assert_eq!(slots, [t0, MINUTE, 2 * MINUTE]);
        // An undated message's redelivery in a later minute finds its answer.
        let first = s.reserve("r", "u", &at("x", t0, None));
        let again = s.reserve("r", "u", &at("x", 5 * MINUTE, None));
        assert!(again.replayed() && again.slot == first.slot);
    }

    #[test]
    fn several_limits_hold_together() {
        let limits =
            [limit(10, MINUTE, Window::Fixed(Placement::Start)), limit(2, SECOND, Window::Fixed(Placement::Start))];
        let slots = run(&limits, &[(0, 1); 12]);
        assert_eq!(&slots[..10], &[0, 0, 1_000, 1_000, 2_000, 2_000, 3_000, 3_000, 4_000, 4_000]);
        assert_eq!(&slots[10..], &[MINUTE, MINUTE]);
    }

    #[test]
    fn beyond_max_delay_nothing_is_reserved_and_replays_return_the_first_answer() {
        let limits = [limit(1, MINUTE, Window::Fixed(Placement::Start))];
        let mut s = Scheduler::new();
        let req = |id: &'static str, now| ReserveRequest { max_delay: 30 * SECOND, ..request(id, &limits, now) };
        assert_eq!(s.reserve("r", "k", &req("a", 0)).status, Status::Reserved);
        let before = s.entity_state("r", "k").cloned();
        let late = s.reserve("r", "k", &req("b", 0));
        assert_eq!((late.slot, late.status), (MINUTE, Status::MaxDelayExceeded));
        assert_eq!(s.entity_state("r", "k").cloned(), before);
        let again = s.reserve("r", "k", &req("a", 5 * MINUTE));
        assert_eq!((again.slot, again.status, again.replayed(), again.decided_at), (0, Status::Reserved, true, 0));
        assert_eq!(s.entity_state("r", "k").cloned(), before);
        assert_ne!(again.attempt, Attempt::Done);
        s.complete("r", "k", ("a", None));
        assert_eq!(s.reserve("r", "k", &req("a", 6 * MINUTE)).attempt, Attempt::Done);
    }
}
