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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Capacity was reserved at `slot`.
    Reserved,
    /// The earliest slot lies beyond `max_delay`: nothing was reserved.
    MaxDelayExceeded,
    /// The cost is more than a limit in force for this entity (an override lowered it): no slot
    /// can ever hold the event, so nothing was reserved.
    CostExceedsLimit,
    /// The key is throttled (paused, or its adaptive level below the ceiling) and the event would
    /// wait past the rule's park horizon, or events of the key are parked already: nothing was
    /// reserved, the message waits in the key's queue (FIFO) and takes its slot when the key's
    /// drain reaches it ([`Scheduler::unpark`]), at the rate in force then. `slot` is the slot it
    /// would have had.
    Parked,
}

/// What a cost reported after the call did ([`Scheduler::correct`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    /// The booked cost became the actual one in every window that could take the difference.
    Applied { booked: u64, actual: u64 },
    /// The message's cost was corrected before: a retried report changes nothing.
    Already,
    /// No reservation of the message is known (never reserved, dead-lettered, or forgotten).
    Unknown,
}

/// What becomes of the old slot of a message given a new one ([`Scheduler::reslot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldSlot {
    /// It still counts in its windows: the downstream received the event, and the rule counts the
    /// calls it refused (`count_refused`).
    Kept,
    /// Its units go back to the windows that have not closed, atomically with taking the new slot:
    /// the event was never delivered (its task found a pause, or it came too late to be delivered
    /// in its slot's windows), or the downstream refused it and the rule does not count refusals.
    GivenBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub slot: Millis,
    pub status: Status,
    /// When the first answer was given: a redelivery is routed as the original was.
    pub decided_at: Millis,
    /// What the attempt that asked may do with the message.
    pub attempt: Attempt,
}

/// What the attempt that asked for a reservation may do with its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A new decision, and its lease: act on it.
    Decided,
    /// The message's earlier answer (nothing consumed now), its lease taken again because the
    /// attempt that had it failed or crashed: act on it.
    Resumed,
    /// Another attempt holds the message's lease and may be acting on it now: this one must not
    /// act (answer 5xx; by the retry that attempt has completed or released it).
    Busy,
    /// The message was acted upon already (see [`Scheduler::complete`]): nothing more to do.
    Done,
}

impl Reservation {
    /// The message had an answer already: this one is it, and nothing was consumed now.
    pub fn replayed(&self) -> bool {
        self.attempt != Attempt::Decided
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    pub message_id: &'a str,
    /// When the message was published (the same on every delivery of it): its answer is filed
    /// under its id and this time's minute (`ANSWER_MINUTE`), as Redis files it; `None` (a message
    /// that did not come from Pub/Sub) files it with the entity's undated answers.
    pub published: Option<Millis>,
    /// At least 1. Above a limit's count in force (or a gcra limit's burst) nothing is reserved:
    /// [`Status::CostExceedsLimit`] (the router dead-letters costs above the rule's counts first).
    pub cost: u64,
    pub limits: &'a [Limit],
    pub max_delay: Millis,
    pub now: Millis,
    /// How long the attempt that gets this answer may act alone on the message (0: no lease).
    /// A lease ends when the attempt completes or releases it, or when it expires (a crash).
    pub lease: Millis,
    /// A frontier carried over from elsewhere (the rule's `previous_key`: the same subject's last
    /// slot under the old key template): the entity's frontier is at least this.
    pub floor: Option<Millis>,
    /// The shared budgets the event also draws from (the rule's `budgets`).
    pub budgets: &'a [Arc<Budget>],
    /// The rule's adaptive limit (AIMD), if it has one: its entity's counts follow the downstream.
    pub adaptive: Option<Adaptive>,
    /// The rule's `delivery_margin`: how late a delivery may be and still count in its slot's
    /// window. No slot lies in the last `margin` of a fixed window (spread placement spaces a
    /// window's events over the rest), and a sliding interval is `per + margin` long, so the limit
    /// holds at delivery times as well as at slots. 0: the limit holds at the slots.
    pub margin: Millis,
    /// For a rule with classes: the key whose classes share its calendar (a budget with
    /// `per_key`, among `budgets`) and the event's class. The entity reserving is the key's class.
    pub class: Option<(&'a str, &'a str)>,
    /// The rule parks its backlog while a key is throttled ([`Status::Parked`]): an event whose
    /// slot lies more than this after now books nothing then. `None`: the rule never parks.
    pub park: Option<Millis>,
}

impl<'a> ReserveRequest<'a> {
    /// A request of cost 1 for `message_id` at `now` under `limits`, with a minute's `max_delay`:
    /// undated, no lease, floor, budget, adaptive limit or margin. Callers change what they need
    /// with `..ReserveRequest::new(..)`, so a new parameter has one default, here.
    pub fn new(message_id: &'a str, limits: &'a [Limit], now: Millis) -> Self {
        Self {
            message_id,
            published: None,
            cost: 1,
            limits,
            max_delay: crate::time::MINUTE,
            now,
            lease: 0,
            floor: None,
            budgets: &[],
            adaptive: None,
            margin: 0,
            class: None,
            park: None,
        }
    }

    /// The same request for an event of `rule`'s class `class` of `key`: the rule's limits are the
    /// key's calendar (`Classes::calendar`, first of `budgets`), none on the entity itself. A rule
    /// without classes keeps the request as it is.
    pub fn for_class(self, rule: &'a Rule, (key, class): (&'a str, &'a str)) -> Self {
        match &rule.classes {
            Some(classes) => {
                // The rule's adaptive level is the calendar's (`Classes::calendar`), not the entity's.
                Self {
                    limits: &[],
                    budgets: &classes.draws,
                    class: Some((key, class)),
                    adaptive: None,
                    park: None,
                    ..self
                }
            }
            None => self,
        }
    }

    /// Whether delivering at `at` an event whose slot is `slot` may put a window over its limit at
    /// the consumer: `at` lies in a later window than the slot's for a fixed limit (the rule's or a
    /// budget's: a slot is never in a window's last `margin`), or more than `margin` (at least
    /// [`DISPATCH_JITTER`]) after the slot for a sliding or gcra limit. Such an event takes a new
    /// slot instead (`LateEvents::Wait`).
    pub fn delivery_is_late(&self, slot: Millis, at: Millis) -> bool {
        let budget_limits = self.budgets.iter().flat_map(|b| &b.limits);
        self.limits.iter().chain(budget_limits).any(|limit| match limit.window() {
            Window::Fixed(_) => at.div_euclid(limit.per()) > slot.div_euclid(limit.per()),
            Window::Sliding | Window::Gcra { .. } => at > slot + self.margin.max(DISPATCH_JITTER),
        })
    }

    /// A request for one event of `rule` at `now`: the rule's limits, `max_delay`, budgets,
    /// adaptive limit and delivery margin; undated, no lease or floor.
    pub fn for_rule(rule: &'a Rule, message_id: &'a str, cost: u64, now: Millis) -> Self {
        Self {
            cost,
            max_delay: rule.max_delay,
            budgets: &rule.budgets,
            adaptive: rule.adaptive,
            margin: rule.delivery_margin,
            park: rule.park(),
            ..Self::new(message_id, &rule.limits, now)
        }
    }
}

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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityState {
    pub last_slot: Option<Millis>,
    pub limits: BTreeMap<String, LimitState>,
    /// By [`override_id`]; kept apart from the state in Redis (they outlive an idle entity).
    pub overrides: BTreeMap<String, LimitOverride>,
    /// The downstream asked to wait (a 429 or 503 with `Retry-After`): no slot before this.
    pub paused_until: Option<Millis>,
    /// The adaptive limit's level after the last 429, 5xx or timeout (kept with the overrides).
    pub adaptive: Option<AdaptiveState>,
    /// The latency controller's state, when the adaptive limit follows latency.
    pub latency: Option<LatencyState>,
    /// How many of its messages are parked ([`Status::Parked`]), waiting in its queue.
    pub parked: u64,
    /// When the latest wake of its drain was armed for, while messages are parked.
    pub wake: Option<Millis>,
}

/// What the drain of a key's parked messages got for the message at the head of its queue
/// ([`Scheduler::unpark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpark {
    /// It left the queue with this answer: a slot at or before the deadline (deliver it then), or,
    /// with nothing reserved, beyond its `max_delay` from when it was parked or over a limit in
    /// force (dead-letter it).
    Decided(Reservation),
    /// Its slot would be later than the deadline: it stays at the head, nothing is reserved, and
    /// the drain wakes again at `wake` (armed: [`EntityState::wake`]): where the slot comes within
    /// the drain's reach, or [`MAX_WAKE_GAP`] from now if sooner.
    Later { slot: Millis, wake: Millis },
    /// The message is not parked (a concurrent drain took it, or it never was): nothing changed.
    NotParked,
    /// The message is parked but not at the head of the queue: nothing changed.
    NotHead,
}

/// When a parked message whose answer expired counts as parked (long before any `max_delay`):
/// reserve.lua's number too.
pub const EXPIRED_PARK: Millis = -(1 << 52);

/// The longest a drain waits between wakes while messages are parked, however far their slots
/// lie (a long pause): a pause lifted early is drained within this, whoever lifted it.
pub const MAX_WAKE_GAP: Millis = 30 * crate::time::SECOND;

/// A drain's wake whose time passed this long ago without a drain re-arming it was lost (a
/// task that was never created): the next message parked arms a new one.
pub const WAKE_LOST_AFTER: Millis = 5 * crate::time::MINUTE;

/// The state of one shared budget: what each window of each limit holds, a pause and the
/// adaptive level, shared by every entity that draws from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetState {
    /// By (per, window start): the cost reserved in that window.
    pub windows: BTreeMap<(Millis, Millis), u64>,
    /// By (per, window start, rule) for each rule holding a floor: its part of that window's cost.
    pub floor_used: BTreeMap<(Millis, Millis, String), u64>,
    /// By per: the run of full windows the last searches of that limit walked.
    pub runs: BTreeMap<Millis, FullRun>,
    pub paused_until: Option<Millis>,
    pub adaptive: Option<AdaptiveState>,
    pub latency: Option<LatencyState>,
    /// A classes calendar's per-key overrides of the rule's limits, by [`override_id`] (`drip
    /// limits set` on a key of a rule with classes): every class of the key books against them.
    pub overrides: BTreeMap<String, LimitOverride>,
    /// A classes calendar: the last slot of what its key booked before the rule had classes (0:
    /// nothing), once the calendar took that backlog over ([`Scheduler::carry_over`]); `None`
    /// before. Every class of the key books after it.
    pub carried: Option<Millis>,
    /// A leased budget's partition pool: by (per, window start), the units its home leased it
    /// (`windows` then holds what the partition booked of them).
    pub leased: BTreeMap<(Millis, Millis), u64>,
    /// A pool: by per, the last window its home had no room in when it last asked (a lease's
    /// `full_through`); the pool asks again only past it.
    pub known_full: BTreeMap<Millis, Millis>,
    /// A leased budget's home: by (per, window start, partition), the units leased to that
    /// partition (`windows` then holds what the home leased in all, less what came back).
    pub granted: BTreeMap<(Millis, Millis, u32), u64>,
    /// A pool: by (per, window start), the units of its lease it gave back to its home (events
    /// that left a window that had not closed), in all: what it may book is `leased − returned`.
    /// Totals, so that telling the home twice, or out of order, changes nothing.
    pub returned: BTreeMap<(Millis, Millis), u64>,
    /// A home: by (per, window start, partition), the units that partition gave back, in all.
    pub taken_back: BTreeMap<(Millis, Millis, u32), u64>,
    /// A pool in Redis: by per, the units of passed windows it was leased and did not book,
    /// counted as it drops them (the model keeps every window: what it stranded is read off them).
    pub stranded: BTreeMap<Millis, u64>,
}

/// What a leased budget's home answers a partition that asks for units of one limit from a window
/// on: the window it leased in and the partition's whole lease of it (a total, so crediting it
/// twice or out of order changes nothing), or `None` when no window up to the horizon had room;
/// and the last window before it that had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub window: Option<Millis>,
    pub total: u64,
    pub full_through: Millis,
}

impl BudgetState {
    /// The home's grant (`lua/lease.lua`): the first window from `from` up to `horizon` whose
    /// leases leave room for `cost` of `count` leases `partition` up to `want` units of it (never
    /// past `count`). A scarce window (less room than asked) is split: a lease takes at most half
    /// of what is left (at least the cost), so partitions asking in turn share it.
    pub fn grant(
        &mut self,
        partition: u32,
        (per, from, horizon): (Millis, Millis, Millis),
        count: u64,
        (cost, want): (u64, u64),
    ) -> Lease {
        let mut window = from;
        while window <= horizon {
            let total = self.windows.entry((per, window)).or_default();
            if *total + cost <= count {
                let room = count - *total;
                let units = if want <= room { want } else { room.div_ceil(2).max(cost) };
                *total += units;
                let held = self.granted.entry((per, window, partition)).or_default();
                *held += units;
                return Lease { window: Some(window), total: *held, full_through: window - per };
            }
            window += per;
        }
        Lease { window: None, total: 0, full_through: window - per }
    }

    /// A partition pool takes a lease of one limit (idempotent: a lease is the partition's total).
    pub fn credit(&mut self, per: Millis, lease: Lease) {
        if let Some(window) = lease.window {
            let leased = self.leased.entry((per, window)).or_default();
            *leased = (*leased).max(lease.total);
        }
        let full = self.known_full.entry(per).or_insert(lease.full_through);
        *full = (*full).max(lease.full_through);
    }

    /// What a pool may book of a window: its lease less what it gave back.
    pub fn pool_holds(&self, per: Millis, window: Millis) -> u64 {
        let leased = self.leased.get(&(per, window)).copied().unwrap_or(0);
        leased.saturating_sub(self.returned.get(&(per, window)).copied().unwrap_or(0))
    }

    /// A pool gives back up to `units` of a window it no longer needs (events left it): what its
    /// lease holds beyond what it booked, at most. Returns its total given back of the window, for
    /// its home ([`BudgetState::take_back`]), when it gave any.
    pub fn give_back_lease(&mut self, per: Millis, window: Millis, units: u64) -> Option<u64> {
        let booked = self.windows.get(&(per, window)).copied().unwrap_or(0);
        let units = units.min(self.pool_holds(per, window).saturating_sub(booked));
        (units > 0).then(|| {
            let total = self.returned.entry((per, window)).or_default();
            *total += units;
            *total
        })
    }

    /// The home takes back what `partition` gave back of a window (`lua/returns.lua`): `total` is
    /// the partition's whole return of it, so only what is new comes off the window's leases.
    /// Returns the units taken back now.
    pub fn take_back(&mut self, partition: u32, (per, window): (Millis, Millis), total: u64) -> u64 {
        let Some(leased) = self.windows.get_mut(&(per, window)) else { return 0 };
        let taken = self.taken_back.entry((per, window, partition)).or_default();
        let new = total.saturating_sub(*taken).min(*leased);
        *taken = (*taken).max(total);
        *leased -= new;
        new
    }
}

/// Consecutive windows `from..=through` of one budget limit, each holding at least `least`: a
/// search for a cost that cannot fit beside `least` jumps over them. Windows only ever gain cost,
/// so a run stays true until its windows pass; it only speeds the search up, never changes a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullRun {
    pub from: Millis,
    pub through: Millis,
    pub least: u64,
}

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

/// How late a sliding or gcra event may be delivered before it counts as late (without a larger
/// `delivery_margin`): the jitter of a Cloud Tasks dispatch. An event later than that has met a
/// fault (a crash, a retried create or publish) and takes a new slot; a few milliseconds of
/// jitter must not send every event of a backlog to its end.
pub const DISPATCH_JITTER: Millis = crate::time::SECOND;

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
}

/// One limit on the entity's own state as it counts this reservation: a rule's limit or a fair
/// share of a budget (a fixed window on the entity's slots), with the count in force.
struct EntityLimit {
    id: String,
    limit: Limit,
    count: u64,
}

/// One budget limit as it counts this reservation.
struct BudgetLimit<'a> {
    budget: &'a Budget,
    limit: Limit,
    /// The count before the adaptive level: the limit's, or a classes calendar's override of it.
    base: u64,
    count: u64,
    /// Whose floor the event books: its class in a classes calendar, else its key's or its rule's
    /// ([`Budget::floor_member`]).
    member: &'a str,
    /// The [`BudgetState`] it counts in ([`Budget::state_name`], or a leased budget's partition pool).
    state: String,
    /// A leased budget's partition: `state` is its pool, the budget's own state its home (which
    /// holds the pause).
    partition: Option<u32>,
    /// A key's fair share of a budget, kept on the key's classes calendar (`budget`): the key's
    /// classes together take at most `count` of each window of the period. No floor applies.
    share: bool,
    /// It books the cost into its windows: not a share whose period a limit of the calendar
    /// counts already (the same windows, the same events).
    counts: bool,
}

impl BudgetLimit<'_> {
    /// The state that holds the budget's pause.
    fn home(&self) -> &str {
        if self.partition.is_some() { &self.budget.name } else { &self.state }
    }
}

/// A leased budget limit (by its place among a request's budget limits) has no units for the cost
/// from this window on: its home is asked before the search goes on.
struct LeaseWanted {
    limit: usize,
    window: Millis,
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
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
                .map(|a| (a.slot, a.corrected.unwrap_or(a.cost))),
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
        let (slot, booked) = (answer.slot, answer.cost);
        answer.corrected = Some(actual);
        self.carry_over(rule, request);
        let Some(entity) = self.entities.get_mut(&(rule.to_owned(), key.to_owned())) else {
            return Correction::Unknown;
        };
        let unit = ReserveRequest { cost: 1, ..*request };
        let shared = budget_limits(&self.budgets, &unit, (rule, key));
        let (_, own) = entity_limits(&entity.state, &unit, &shared);
        let moved = (request.now, slot, actual.abs_diff(booked));
        if actual < booked {
            give_back(&mut entity.state, &mut self.budgets, moved, &own, &shared);
        } else if actual > booked {
            charge(&mut entity.state, &mut self.budgets, moved, &own, &shared);
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
    /// filed, after the units of `given_back` (a slot and the cost it booked) went back (unless the
    /// cost is over a count in force).
    fn decide(
        &mut self,
        rule: &str,
        key: &str,
        request: &ReserveRequest<'_>,
        given_back: Option<(Millis, u64)>,
    ) -> Reservation {
        let request = &self.with_carried_floor(request);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let shared = budget_limits(&self.budgets, request, (rule, key));
        let (exceeded, own) = entity_limits(&entity.state, request, &shared);
        if let Some((old, cost)) = given_back.filter(|_| !exceeded) {
            give_back(&mut entity.state, &mut self.budgets, (request.now, old, cost), &own, &shared);
        }
        let slot =
            if exceeded { request.now } else { search(&entity.state, &mut self.budgets, request, (&own, &shared)) };
        let status = if exceeded {
            Status::CostExceedsLimit
        } else if slot > request.now + request.max_delay {
            Status::MaxDelayExceeded
        } else if parks(&entity.state, throttled_budget(&self.budgets, request, &shared), request, slot) {
            entity.queue.push_back(answer_file(request.message_id, request.published));
            entity.state.parked += 1;
            Status::Parked
        } else {
            commit(&mut entity.state, request, &own, slot);
            for BudgetLimit { budget, limit, member, state, partition, share, .. } in shared.iter().filter(|l| l.counts)
            {
                let (state, per) = (self.budgets.entry(state.clone()).or_default(), limit.per());
                let window = slot.div_euclid(per) * per;
                if partition.is_some() {
                    // A pool keeps no window before the one before now's (reserve.lua drops them here too).
                    let current = request.now.div_euclid(per) * per - per;
                    state.windows.retain(|&(p, w), _| p != per || w >= current);
                    state.leased.retain(|&(p, w), _| p != per || w >= current);
                    state.returned.retain(|&(p, w), _| p != per || w >= current);
                }
                *state.windows.entry((per, window)).or_default() += request.cost;
                if !share && budget.floors.iter().any(|(floor, _)| floor == member) {
                    *state.floor_used.entry((per, window, (*member).to_owned())).or_default() += request.cost;
                }
            }
            Status::Reserved
        };
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

    /// The drain of a key's parked messages, at the message at the head of its queue (`request`
    /// names it, with the rule's parameters at `now`): the slot it would get now, reserved when it
    /// is no later than `deadline` (the message leaves the queue with that answer, a lease taken
    /// for the drain's attempt), else left for a later wake. A message parked longer than its
    /// `max_delay` (from when it was parked), or whose cost is over a limit in force now, leaves
    /// with nothing reserved. The drain books at the key's frontier with the ordinary arithmetic,
    /// one message after another in the queue's order, so every window stays exact.
    pub fn unpark(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>, deadline: Millis) -> Unpark {
        let file = answer_file(request.message_id, request.published);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let since = match entity.answers.get(&file) {
            Some(answer) if answer.status == Status::Parked => answer.decided_at,
            // Its answer expired (the drain stopped for longer than max_delay and the margin).
            None if entity.queue.front() == Some(&file) => EXPIRED_PARK,
            _ if !entity.queue.contains(&file) => return Unpark::NotParked,
            _ => return Unpark::NotHead,
        };
        if entity.queue.front() != Some(&file) {
            return Unpark::NotHead;
        }
        // What is left of its max_delay, from when it was parked (negative once it has passed).
        let request = ReserveRequest { max_delay: since + request.max_delay - request.now, park: None, ..*request };
        let (exceeded, slot) = self.earliest(rule, key, &request);
        let entity = self.entities.get_mut(&(rule.to_owned(), key.to_owned())).expect("entered above");
        if !exceeded && slot <= request.now + request.max_delay && slot > deadline {
            let wake = (slot - (deadline - request.now)).clamp(request.now, request.now + MAX_WAKE_GAP);
            entity.state.wake = Some(wake);
            return Unpark::Later { slot, wake };
        }
        entity.queue.pop_front();
        entity.state.parked -= 1;
        if entity.queue.is_empty() {
            entity.state.wake = None;
        }
        entity.answers.remove(&file);
        Unpark::Decided(self.decide(rule, key, &request, None))
    }

    /// A message of the key was parked at `now` and its drain should wake at `wanted`: returns the
    /// wake to arm (and records it), or `None` when one is armed already (and not lost: see
    /// [`WAKE_LOST_AFTER`]) or nothing is parked any more.
    pub fn arm_wake(&mut self, rule: &str, key: &str, now: Millis, wanted: Millis) -> Option<Millis> {
        let entity = self.entities.get_mut(&(rule.to_owned(), key.to_owned()))?;
        let state = &mut entity.state;
        if state.parked == 0 || state.wake.is_some_and(|wake| wake + WAKE_LOST_AFTER >= now) {
            return None;
        }
        let wake = wanted.clamp(now, now + MAX_WAKE_GAP);
        state.wake = Some(wake);
        Some(wake)
    }

    /// The key's parked messages, oldest first.
    pub fn parked(&self, rule: &str, key: &str) -> Vec<AnswerFile> {
        self.entities
            .get(&(rule.to_owned(), key.to_owned()))
            .map_or_else(Vec::new, |e| e.queue.iter().cloned().collect())
    }

    /// Whether the request's cost is over a count in force, and the slot its entity would give it
    /// now (the runs its search walked are kept; nothing else changes).
    fn earliest(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>) -> (bool, Millis) {
        self.carry_over(rule, request);
        let request = &self.with_carried_floor(request);
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        let shared = budget_limits(&self.budgets, request, (rule, key));
        let (exceeded, own) = entity_limits(&entity.state, request, &shared);
        if exceeded {
            return (true, request.now);
        }
        (false, search(&entity.state, &mut self.budgets, request, (&own, &shared)))
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

/// Gives the units of `old` (a slot of the request's message that was never used) back, wherever
/// the window that holds them has not closed at `now` and can take them back exactly: the
/// entity's fixed (start) windows and fair shares when `old` lies in the window the entity holds,
/// budgets' start-placed windows (a run of full windows it lies in keeps only what it now holds);
/// gcra and sliding limits only when `old` is the entity's latest slot (undoing an earlier one
/// would need the slots after it). Spread-placed windows keep them: the positions of their later
/// events count on them. What is kept is only capacity unused, never a window over its limit.
fn give_back(
    state: &mut EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    (now, old, cost): (Millis, Millis, u64),
    own: &[EntityLimit],
    shared: &[BudgetLimit<'_>],
) {
    let latest = state.last_slot == Some(old);
    for EntityLimit { id, limit, count } in own {
        let per = limit.per();
        match (limit.window(), state.limits.get_mut(id)) {
            (Window::Fixed(Placement::Start), Some(LimitState::Fixed { window, used }))
                if *window == old.div_euclid(per) * per && *window + per > now =>
            {
                *used = used.saturating_sub(cost);
            }
            (Window::Gcra { .. }, Some(LimitState::Gcra { tat, tat_rem })) if latest => {
                // TAT − cost·T, exactly: its remainder is in units of 1/count ms.
                let n = *count as i64;
                let d = *tat_rem as i64 - cost as i64 * per;
                *tat += d.div_euclid(n);
                *tat_rem = d.rem_euclid(n) as u64;
            }
            (Window::Sliding, Some(LimitState::Sliding { base, entries })) if latest => {
                let before = entries.len().checked_sub(2).map_or(*base, |i| entries[i].1);
                if let Some(newest) = entries.back_mut().filter(|(time, _)| *time == old) {
                    newest.1 = newest.1.saturating_sub(cost);
                    if newest.1 <= before {
                        entries.pop_back();
                    }
                }
            }
            _ => {}
        }
    }
    shift_budget_windows(budgets, shared, (now, old), -(cost as i64));
}

/// Charges `more` units to `slot`'s windows (a cost reported after the call above what was booked):
/// the entity's fixed windows and fair shares when `slot` lies in the window it holds, budgets'
/// windows that have not closed, a gcra limit's TAT (it moves later), a sliding limit's newest slot
/// (every interval a later slot can share with `slot` also holds the newest). A window may then
/// hold more than its count: later slots move out until it passes.
fn charge(
    state: &mut EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    (now, slot, more): (Millis, Millis, u64),
    own: &[EntityLimit],
    shared: &[BudgetLimit<'_>],
) {
    for EntityLimit { id, limit, count } in own {
        let per = limit.per();
        match state.limits.get_mut(id) {
            Some(LimitState::Fixed { window, used }) if *window == slot.div_euclid(per) * per => *used += more,
            Some(LimitState::Gcra { tat, tat_rem }) => {
                let rem = *tat_rem + more * per as u64;
                *tat += (rem / count) as i64;
                *tat_rem = rem % count;
            }
            Some(LimitState::Sliding { entries, .. }) => {
                if let Some(newest) = entries.back_mut() {
                    newest.1 += more;
                }
            }
            _ => {}
        }
    }
    shift_budget_windows(budgets, shared, (now, slot), more as i64);
}

/// Moves `delta` units into (positive) or out of (negative) the window of `slot` of each budget
/// limit in `shared`, where it has not closed at `now`: out only of start-placed windows (the
/// positions of a spread window's later events count on what it holds), never below zero, and a
/// run of full windows it lies in keeps only what the window now holds.
fn shift_budget_windows(
    budgets: &mut HashMap<String, BudgetState>,
    shared: &[BudgetLimit<'_>],
    (now, slot): (Millis, Millis),
    delta: i64,
) {
    for BudgetLimit { budget, limit, member, state, partition, share, .. } in shared.iter().filter(|l| l.counts) {
        let (per, window) = (limit.per(), slot.div_euclid(limit.per()) * limit.per());
        let spread = limit.window() != Window::Fixed(Placement::Start);
        if window + per <= now || (delta < 0 && spread) {
            continue;
        }
        let Some(held) = budgets.get_mut(state) else { continue };
        let Some(used) = held.windows.get_mut(&(per, window)) else { continue };
        let before = *used;
        *used = used.saturating_add_signed(delta);
        let least = *used;
        if let Some(part) = held.floor_used.get_mut(&(per, window, member.to_string())).filter(|_| !share) {
            *part = part.saturating_add_signed(delta);
        }
        if delta < 0
            && let Some(run) = held.runs.get_mut(&per).filter(|r| (r.from..=r.through).contains(&window))
        {
            run.least = run.least.min(least);
        }
        // A pool gives what left its window back to its home (the store sends it after the call:
        // `RedisStore::send_returns`), so that other partitions can lease it.
        if let Some(partition) = partition.filter(|_| delta < 0)
            && let Some(total) = held.give_back_lease(per, window, before - least)
        {
            budgets.entry(budget.name.clone()).or_default().take_back(partition, (per, window), total);
        }
    }
}

/// Whether an event of the entity whose earliest slot is `slot` parks instead of booking it: its
/// rule parks, and messages of the key are parked already (FIFO), or the key is throttled (paused,
/// or its adaptive level below the ceiling; or one of its budgets, `budget_throttled`) and the
/// slot lies past the park horizon.
fn parks(state: &EntityState, budget_throttled: bool, request: &ReserveRequest<'_>, slot: Millis) -> bool {
    let Some(horizon) = request.park else { return false };
    let paused = state.paused_until.is_some_and(|until| until > request.now);
    let lowered = request
        .adaptive
        .is_some_and(|a| a.level(state.adaptive, adaptive_window(request.limits), request.now) < a.ceiling());
    state.parked > 0 || ((paused || lowered || budget_throttled) && slot > request.now + horizon)
}

/// Whether a budget the request draws from is paused, or its adaptive level below its ceiling.
fn throttled_budget(
    budgets: &HashMap<String, BudgetState>,
    request: &ReserveRequest<'_>,
    shared: &[BudgetLimit<'_>],
) -> bool {
    shared.iter().any(|l| {
        let held = budgets.get(&l.state);
        let paused = budgets.get(l.home()).and_then(|s| s.paused_until).is_some_and(|until| until > request.now);
        let lowered = l
            .budget
            .adaptive
            .is_some_and(|a| budget_level(l.budget, held, request.now).is_some_and(|level| level < a.ceiling()));
        paused || lowered
    })
}

/// The entity's last slot, or the floor the request carries over if later.
fn frontier(state: &EntityState, request: &ReserveRequest<'_>) -> Option<Millis> {
    match (state.last_slot, request.floor) {
        (Some(last), Some(floor)) => Some(last.max(floor)),
        (last, floor) => last.or(floor),
    }
}

/// The entity's own limits with their counts in force now (the rule's, an override, the adaptive
/// level), and its fair share of each budget limit in `shared`; `true` when the cost is over a
/// count the entity cannot change (the rule's or an override: adaptive counts and shares never go
/// below the cost).
fn entity_limits(
    state: &EntityState,
    request: &ReserveRequest<'_>,
    shared: &[BudgetLimit<'_>],
) -> (bool, Vec<EntityLimit>) {
    let level = request.adaptive.map(|a| a.level(state.adaptive, adaptive_window(request.limits), request.now));
    let mut exceeded = false;
    let mut own: Vec<EntityLimit> = request
        .limits
        .iter()
        .map(|limit| {
            let base = effective_limit(limit, &state.overrides, request.now);
            exceeded |= request.cost > limit.max_cost(base);
            EntityLimit { id: state_id(limit), limit: *limit, count: adapted_count(limit, base, level, request.cost) }
        })
        .collect();
    for BudgetLimit { budget, limit, base, count, .. } in shared {
        exceeded |= request.cost > *base;
        // A class's key takes its shares on its calendar (`budget_limits`), not on the class.
        if let Some(share) = budget.share_of(*count, request.cost).filter(|_| request.class.is_none()) {
            let fixed = Limit::new(share, limit.per(), Window::Fixed(Placement::Start)).expect("share >= 1");
            own.push(EntityLimit { id: budget.share_id(limit), limit: fixed, count: share });
        }
    }
    (exceeded, own)
}

fn budget_level(budget: &Budget, state: Option<&BudgetState>, now: Millis) -> Option<u64> {
    budget.adaptive.map(|a| a.level(state.and_then(|s| s.adaptive), adaptive_window(&budget.limits), now))
}

/// Every limit of every budget the request (an event of `rule`) draws from, with its count in force now.
fn budget_limits<'a>(
    budgets: &HashMap<String, BudgetState>,
    request: &ReserveRequest<'a>,
    (rule, key): (&'a str, &str),
) -> Vec<BudgetLimit<'a>> {
    let mut shared = Vec::new();
    let (scope, class) = request.class.unzip();
    for budget in request.budgets {
        let partition = budget.partition_of(scope.unwrap_or(key));
        let state = partition.map_or_else(|| budget.state_name(scope), |p| budget.pool_name(p));
        let held = budgets.get(&state);
        let level = budget_level(budget, held, request.now);
        let member =
            if budget.per_key { class.unwrap_or_default() } else { budget.floor_member(rule, scope.unwrap_or(key)) };
        for limit in &budget.limits {
            let base = held.map_or(limit.limit(), |held| effective_limit(limit, &held.overrides, request.now));
            let count = adapted_count(limit, base, level, request.cost);
            let (limit, state) = (*limit, state.clone());
            shared.push(BudgetLimit {
                budget,
                limit,
                base,
                count,
                member,
                state,
                partition,
                share: false,
                counts: true,
            });
        }
    }
    // A class's key's fair share of each budget: one more limit of its calendar, counting the
    // key's classes together (in windows of the share's period; a calendar limit of that period
    // counts them already).
    if let Some(calendar) = request.budgets.iter().find(|b| b.per_key)
        && let Some(scope) = scope
    {
        let mut shares = Vec::new();
        for CalendarShare { budget, limit, per, counts, .. } in calendar_shares(calendar, request.budgets) {
            let from = &request.budgets[budget].limits[limit];
            let held = shared.iter().find(|l| std::ptr::eq(l.budget, &*request.budgets[budget]) && l.limit == *from);
            let Some(share) = held.and_then(|l| l.budget.share_of(l.count, request.cost)) else { continue };
            shares.push(BudgetLimit {
                budget: calendar,
                limit: Limit::new(share, per, Window::Fixed(Placement::Start)).expect("share >= 1"),
                base: share,
                count: share,
                member: class.unwrap_or_default(),
                state: calendar.state_name(Some(scope)),
                partition: None,
                share: true,
                counts,
            });
        }
        shared.extend(shares);
    }
    shared
}

/// The entity's earliest slot ([`earliest_slot`]), each leased budget's home asked for a lease
/// where its pool has none, and the runs of full windows the search walked kept.
fn search(
    state: &EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    request: &ReserveRequest<'_>,
    (own, shared): (&[EntityLimit], &[BudgetLimit<'_>]),
) -> Millis {
    let (slot, runs) = loop {
        match earliest_slot(state, budgets, request, own, shared) {
            Ok(found) => break found,
            Err(wanted) => lease(budgets, &shared[wanted.limit], request, wanted.window),
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
        .map(|l| budgets.get(&l.state).filter(|_| l.counts).and_then(|s| s.runs.get(&l.limit.per()).copied()))
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
            let accepted = if l.partition.is_some() {
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
                .filter(|(l, _)| l.counts)
                .filter_map(|(l, run)| Some(((l.state.clone(), l.limit.per()), run?)));
            return Ok((t, walked.collect()));
        }
        t = next;
    }
}

/// The earliest time ≥ `t` at which a partition's pool of a leased budget limit accepts the
/// request's cost more: the first window from `t`'s whose lease has room for it (one past the
/// horizon ends the search). A window without room that the home was not known to be full in is
/// `Err`: the home is asked for a lease from it first. Windows the pool holds no lease in past its
/// last leased one are jumped (`lua/reserve.lua` walks them the same way).
fn pool_accepts(
    held: Option<&BudgetState>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    t: Millis,
) -> Result<Millis, Millis> {
    let (per, cost) = (limit.limit.per(), request.cost);
    let horizon = request.now + request.max_delay;
    let (mut window, t) = outside_margin(t, per, request.margin);
    let full = held.and_then(|s| s.known_full.get(&per).copied()).unwrap_or(Millis::MIN);
    let top =
        held.and_then(|s| s.leased.keys().filter(|(p, _)| *p == per).map(|&(_, w)| w).max()).unwrap_or(Millis::MIN);
    loop {
        if window > horizon {
            return Ok(t.max(window));
        }
        let used = held.and_then(|s| s.windows.get(&(per, window)).copied()).unwrap_or(0);
        let leased = held.map_or(0, |s| s.pool_holds(per, window));
        if used + cost <= leased {
            return Ok(t.max(window));
        }
        if window > full {
            return Err(window);
        }
        window = if window >= top { full + per } else { window + per };
    }
}

/// Asks the home of a leased budget limit for units from `window` on and credits the partition's
/// pool with what it leased (what `RedisStore` does in two calls between two reservation calls).
/// A partition asks for what it will use soon: what it booked of the window before, less what it
/// holds of this one ([`pool_demand`]), and at least a chunk ([`Leases::want`]).
fn lease(
    budgets: &mut HashMap<String, BudgetState>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    window: Millis,
) {
    let (Some(partition), Some(leases)) = (limit.partition, limit.budget.leases) else { return };
    let per = limit.limit.per();
    let demand = pool_demand(budgets.get(&limit.state), per, window);
    let want = leases.want(limit.count, request.cost).max(demand);
    let span = (per, window, request.now + request.max_delay);
    let lease =
        budgets.entry(limit.budget.name.clone()).or_default().grant(partition, span, limit.count, (request.cost, want));
    budgets.entry(limit.state.clone()).or_default().credit(per, lease);
}

/// About what a pool will use of `window`: what it booked of the window before, less what it holds
/// of `window` (a pool keeps the window before now's for this). Asking for more (doubling what it
/// holds when that runs out) strands more of each window: measured in docs/capacity.md.
fn pool_demand(pool: Option<&BudgetState>, per: Millis, window: Millis) -> u64 {
    let before = pool.and_then(|p| p.windows.get(&(per, window - per)).copied()).unwrap_or(0);
    let held = pool.map_or(0, |p| p.pool_holds(per, window));
    before.saturating_sub(held)
}

/// The earliest time ≥ `t` at which one budget limit accepts the request's cost more: the first
/// window from `t`'s with room ([`window_takes`]; a window past the horizon ends the search: the
/// event is late whatever it holds), and the limit's run of full windows after this search.
fn budget_accepts(
    held: Option<&BudgetState>,
    run: Option<FullRun>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    t: Millis,
) -> (Millis, Option<FullRun>) {
    let (per, n, cost, margin) = (limit.limit.per(), limit.count, request.cost, request.margin);
    let horizon = request.now + request.max_delay;
    let (mut window, t) = outside_margin(t, per, margin);
    let jumpable = run.filter(|r| r.least + cost > n);
    let (mut walked, mut jumped): (Option<FullRun>, bool) = (None, false);
    let accepted = loop {
        if window > horizon {
            break t.max(window);
        }
        if let Some(r) = jumpable
            && (r.from..=r.through).contains(&window)
        {
            (window, jumped) = (r.through + per, true);
            continue;
        }
        let used = held.and_then(|s| s.windows.get(&(per, window)).copied()).unwrap_or(0);
        let used_by = |rule: &str| held.and_then(|s| s.floor_used.get(&(per, window, rule.to_owned())).copied());
        let started = window <= request.now;
        if window_takes(limit, (used, used_by), cost, started) {
            let spread = limit.limit.window() == Window::Fixed(Placement::Spread);
            break t.max(if spread { spread_position(window, used, per - margin, n) } else { window });
        }
        walked = Some(match walked {
            None => FullRun { from: window, through: window, least: used },
            Some(w) => FullRun { through: window, least: w.least.min(used), ..w },
        });
        window += per;
    };
    let Some(w) = walked else { return (accepted, run) };
    let Some(r) = run else { return (accepted, Some(w)) };
    let kept = if jumped {
        // The walk went around the run: one stretch, if what it walked holds as much.
        (w.least >= r.least).then(|| FullRun { from: w.from.min(r.from), through: w.through.max(r.through), ..r })
    } else if r.through < request.now.div_euclid(per) * per || r.least + cost <= n || w.from < r.from {
        // The run has passed, this cost fits beside it, or the walk lies nearer now.
        Some(w)
    } else {
        (w.from == r.through + per && w.least >= r.least).then_some(FullRun { through: w.through, ..r })
    };
    (accepted, Some(kept.unwrap_or(r)))
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

/// Whether a budget window with `n` in force, holding `used` (of which `used_by(rule)` by each
/// rule holding a floor), takes `cost` more of the limit's rule: never past `n`; and before the
/// window starts, what the cost takes beyond its own rule's unused floor must leave every other
/// floor's unused units free (the window's total plus every unused floor stays within `n`). Once
/// the window has started, unused floors are anyone's. A cost within its own floor needs only
/// room, so a floor holds even after the count in force fell.
fn window_takes(
    limit: &BudgetLimit<'_>,
    (used, used_by): (u64, impl Fn(&str) -> Option<u64>),
    cost: u64,
    started: bool,
) -> bool {
    let n = limit.count;
    if used + cost > n {
        return false;
    }
    if started || limit.share || limit.budget.floors.is_empty() {
        return true;
    }
    let (mut unused, mut own_unused) = (0, 0);
    for (member, units) in limit.budget.floor_units(n) {
        let left = units.saturating_sub(used_by(member).unwrap_or(0));
        unused += left;
        if member == limit.member {
            own_unused = left;
        }
    }
    let borrowed = cost.saturating_sub(own_unused);
    borrowed == 0 || used + unused + borrowed <= n
}

/// Where `spread` placement puts the next event of a window holding `used` of `n`: evenly over the
/// window's first `span` milliseconds.
fn spread_position(window: Millis, used: u64, span: Millis, n: u64) -> Millis {
    window + (used as i64 * span).div_euclid(n as i64)
}

/// The window of `t` and `t` itself, or, when `t` lies in the window's last `margin`, the next
/// window and its start: a delivery up to `margin` late still lands in its slot's window.
fn outside_margin(t: Millis, per: Millis, margin: Millis) -> (Millis, Millis) {
    let window = t.div_euclid(per) * per;
    if t >= window + per - margin { (window + per, window + per) } else { (window, t) }
}

fn commit(state: &mut EntityState, request: &ReserveRequest<'_>, own: &[EntityLimit], slot: Millis) {
    let cost = request.cost;
    for EntityLimit { id, limit, count: n } in own {
        let (per, n) = (limit.per(), *n);
        let entry = state.limits.entry(id.clone());
        match limit.window() {
            Window::Fixed(_) => {
                let window = slot.div_euclid(per) * per;
                let fresh = LimitState::Fixed { window, used: 0 };
                let current = entry.or_insert(fresh.clone());
                if !matches!(current, LimitState::Fixed { window: w, .. } if *w == window) {
                    *current = fresh;
                }
                if let LimitState::Fixed { used, .. } = current {
                    *used += cost;
                }
            }
            Window::Gcra { .. } => {
                let current = entry.or_insert(LimitState::Gcra { tat: slot, tat_rem: 0 });
                if let LimitState::Gcra { tat, tat_rem } = current {
                    // A slot this limit set is TAT rounded up to the millisecond; counting from the
                    // rounded slot would make the rate drift, so only a later slot restarts TAT.
                    let tat_ceil = *tat + i64::from(*tat_rem > 0);
                    if slot > tat_ceil {
                        (*tat, *tat_rem) = (slot, 0);
                    }
                    let rem = *tat_rem + cost * per as u64;
                    *tat += (rem / n) as i64;
                    *tat_rem = rem % n;
                }
            }
            Window::Sliding => {
                let current = entry.or_insert(LimitState::Sliding { base: 0, entries: VecDeque::new() });
                if let LimitState::Sliding { base, entries } = current {
                    match entries.back_mut() {
                        Some((time, cum)) if *time == slot => *cum += cost,
                        last => {
                            let total = last.map_or(*base, |&mut (_, cum)| cum);
                            entries.push_back((slot, total + cost));
                        }
                    }
                    while let Some(&(time, cum)) = entries.front() {
                        if time > slot - per - request.margin {
                            break;
                        }
                        *base = cum;
                        entries.pop_front();
                    }
                }
            }
        }
    }
    state.last_slot = Some(slot);
}

/// What a rule's fields mean for one request: they read the request types, so they live beside
/// them (and the rules file's types stay free of the model's).
impl Rule {
    /// What becomes of the slot of an event the downstream refused (429/503) when it is given a
    /// new one: kept when the rule counts refused calls, else given back.
    pub fn refused_slot(&self) -> OldSlot {
        match self.count_refused {
            true => OldSlot::Kept,
            false => OldSlot::GivenBack,
        }
    }

    /// Whether an event of this rule delivered at `at` for `slot` would be late
    /// (`ReserveRequest::delivery_is_late`), and the rule wants such events to wait their turn.
    pub fn waits_when_late(&self, slot: Millis, at: Millis) -> bool {
        self.late_events == LateEvents::Wait && ReserveRequest::for_rule(self, "", 1, 0).delivery_is_late(slot, at)
    }
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

#[cfg(test)]
mod lease_tests {
    use super::tests::request;
    use super::*;
    use crate::time::SECOND;

    #[test]
    fn one_attempt_acts_at_a_time_and_a_failed_or_crashed_one_hands_over() {
        let limits = [Limit::new(10, SECOND, Window::Fixed(crate::rules::Placement::Start)).unwrap()];
        let req = |now| ReserveRequest { max_delay: SECOND, lease: 100, ..request("m", &limits, now) };
        let mut s = Scheduler::new();
        assert_eq!(s.reserve("r", "k", &req(0)).attempt, Attempt::Decided);
        let concurrent = s.reserve("r", "k", &req(50));
        assert_eq!(concurrent.attempt, Attempt::Busy);
        s.release("r", "k", ("m", None));
        let retry = s.reserve("r", "k", &req(60));
        assert_eq!(retry.attempt, Attempt::Resumed, "a released lease is taken by the retry");
        assert_eq!(s.reserve("r", "k", &req(100)).attempt, Attempt::Busy, "the retry holds it until 160");
        assert_eq!(
            s.reserve("r", "k", &req(160)).attempt,
            Attempt::Resumed,
            "an expired lease (a crashed attempt) is taken over"
        );
        s.complete("r", "k", ("m", None));
        let done = s.reserve("r", "k", &req(170));
        assert_eq!(done.attempt, Attempt::Done);
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

#[cfg(test)]
mod budget_tests {
    use proptest::strategy::{Just, Strategy};

    use super::tests::request;
    use super::*;
    use crate::budgets::{Adaptive, PPM};
    use crate::time::SECOND;

    fn budget(limit: u64, placement: Placement, max_share: Option<u64>) -> Arc<Budget> {
        Arc::new(Budget {
            name: "gateway".into(),
            limits: vec![Limit::new(limit, SECOND, Window::Fixed(placement)).unwrap()],
            max_share,
            adaptive: None,
            floors: Vec::new(),
            per_key: false,
            leases: None,
            tag: "gateway".into(),
        })
    }

    /// A budget of 10 a second leased over two partitions, a unit at a time: each partition asks its
    /// home when its pool has no room, for what it booked of the window before (here nothing: a
    /// chunk, one unit); the home leases a window out and no further, and a partition that finds it
    /// full asks from the next window and remembers it.
    #[test]
    fn a_leased_budget_s_partitions_book_what_their_home_leased_them() {
        let leases = crate::budgets::Leases { partitions: 2, chunk: 100_000 };
        let budgets = [Arc::new(Budget { leases: Some(leases), ..(*budget(10, Placement::Start, None)).clone() })];
        let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
        let (p0, p1) = (in_partition(0), in_partition(1));
        let mut s = Scheduler::new();
        let slots: Vec<Millis> = (0..12)
            .map(|i| reserve(&mut s, if i % 2 == 0 { &p0 } else { &p1 }, &format!("m{i}"), 0, &budgets).slot)
            .collect();
        // Each leases a unit per event until the window is leased out (5 each); then each finds it
        // full and leases a unit of the next.
        assert_eq!(slots, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, SECOND, SECOND]);
        let home = s.budget_state("gateway").unwrap();
        assert_eq!(home.windows, BTreeMap::from([((SECOND, 0), 10), ((SECOND, SECOND), 2)]));
        assert_eq!(home.granted.get(&(SECOND, 0, 0)), Some(&5));
        assert_eq!(home.granted.get(&(SECOND, 0, 1)), Some(&5));
        let pool = s.budget_state(&budgets[0].pool_name(1)).unwrap();
        assert_eq!(pool.known_full.get(&SECOND), Some(&0), "p1 knows window 0 is leased out");
        assert_eq!((pool.windows.get(&(SECOND, SECOND)), pool.leased.get(&(SECOND, SECOND))), (Some(&1), Some(&1)));
        // The next window p1 asks for: what it booked of the window before (5), less what it holds.
        let more = reserve(&mut s, &p1, "m12", 0, &budgets).slot;
        assert_eq!(more, SECOND);
        let pool = s.budget_state(&budgets[0].pool_name(1)).unwrap();
        assert_eq!(pool.leased.get(&(SECOND, SECOND)), Some(&5), "asked 5 - 1 = 4 more");
        // A scarce window is split: a partition asking for more than is left gets half of it.
        let mut home = BudgetState::default();
        let grant = |home: &mut BudgetState, partition, want| home.grant(partition, (SECOND, 0, SECOND), 10, (1, want));
        assert_eq!(grant(&mut home, 0, 6).total, 6, "room enough: what it asked");
        assert_eq!(grant(&mut home, 1, 8).total, 2, "4 left, 8 asked: half");
        assert_eq!(grant(&mut home, 0, 8).total, 7, "2 left: half");
        assert_eq!(grant(&mut home, 1, 8).total, 3, "1 left: the cost");
        assert_eq!(grant(&mut home, 1, 8).window, Some(SECOND), "window 0 is leased out: the next");
        // A pause of a leased budget is its home's: both partitions wait.
        s.pause_budget("gateway", 5 * SECOND);
        assert_eq!(reserve(&mut s, &p0, "late", 0, &budgets).slot, 5 * SECOND);
    }

    /// A partition that leased a whole window gives what left it back to the home (an event
    /// reslotted, its old slot given back), and the other partition leases it: without the return
    /// it would find the window leased out and take the next.
    #[test]
    fn a_partition_gives_back_what_left_its_lease_and_another_leases_it() {
        let leases = crate::budgets::Leases { partitions: 2, chunk: crate::budgets::PPM };
        let budgets = [Arc::new(Budget { leases: Some(leases), ..(*budget(10, Placement::Start, None)).clone() })];
        let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
        let (p0, p1) = (in_partition(0), in_partition(1));
        let mut s = Scheduler::new();
        let slots: Vec<Millis> = (0..4).map(|i| reserve(&mut s, &p0, &format!("m{i}"), 0, &budgets).slot).collect();
        assert_eq!(slots, [0; 4]);
        assert_eq!(s.budget_state("gateway").unwrap().granted.get(&(SECOND, 0, 0)), Some(&10), "the whole window");
        // Two of p0's events leave window 0 (their task found a pause, say): their units go back.
        for (id, now) in [("m1", 100), ("m2", 150)] {
            let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
            let request = ReserveRequest { max_delay: 10 * SECOND, budgets: &budgets, ..request(id, &limits, now) };
            s.reslot("r", &p0, &request, OldSlot::GivenBack);
        }
        let pool = s.budget_state(&budgets[0].pool_name(0)).unwrap();
        assert_eq!(pool.returned.get(&(SECOND, 0)), Some(&2), "{pool:?}");
        assert_eq!(pool.pool_holds(SECOND, 0), 8);
        let home = s.budget_state("gateway").unwrap();
        assert_eq!(home.windows.get(&(SECOND, 0)), Some(&8), "the home leased 10 and took 2 back");
        assert_eq!(home.taken_back.get(&(SECOND, 0, 0)), Some(&2));
        // What they gave back went home; their new slots are in what p0 still held, at now.
        assert_eq!(pool.windows.get(&(SECOND, 0)), Some(&4), "m0, m3 and the two reslotted");
        // p1 leases the 2 that came back in window 0.
        assert_eq!(reserve(&mut s, &p1, "n0", 200, &budgets).slot, 200);
        assert_eq!(s.budget_state("gateway").unwrap().granted.get(&(SECOND, 0, 1)), Some(&1), "half of 2, at least 1");
        // A return told twice takes nothing more back.
        let mut home = s.budget_state("gateway").unwrap().clone();
        let before = home.windows.get(&(SECOND, 0)).copied();
        assert_eq!(home.take_back(0, (SECOND, 0), 2), 0);
        assert_eq!(home.windows.get(&(SECOND, 0)).copied(), before);
    }

    fn reserve(s: &mut Scheduler, key: &str, id: &str, now: Millis, budgets: &[Arc<Budget>]) -> Reservation {
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let request = ReserveRequest { max_delay: 10 * SECOND, budgets, ..request(id, &limits, now) };
        s.reserve("r", key, &request)
    }

    #[test]
    fn entities_share_a_budget_and_a_backlogged_one_does_not_block_the_others() {
        let budgets = [budget(4, Placement::Start, None)];
        let mut s = Scheduler::new();
        let a: Vec<Millis> = (0..10).map(|i| reserve(&mut s, "a", &format!("a{i}"), 0, &budgets).slot).collect();
        assert_eq!(a, [0, 0, 0, 0, 1_000, 1_000, 1_000, 1_000, 2_000, 2_000]);
        // Window 2s holds 2 of a's; b takes the rest of it, then the first free window.
        let b: Vec<Millis> = (0..3).map(|i| reserve(&mut s, "b", &format!("b{i}"), 500, &budgets).slot).collect();
        assert_eq!(b, [2_000, 2_000, 3_000]);
        assert_eq!(s.budget_state("gateway").unwrap().windows[&(SECOND, 2_000)], 4);
    }

    #[test]
    fn a_fair_share_leaves_the_others_room_and_a_paused_budget_waits() {
        let budgets = [budget(10, Placement::Start, Some(300_000))];
        let mut s = Scheduler::new();
        let flood: Vec<Millis> = (0..7).map(|i| reserve(&mut s, "noisy", &format!("n{i}"), 0, &budgets).slot).collect();
        assert_eq!(flood, [0, 0, 0, 1_000, 1_000, 1_000, 2_000], "3 of each window of 10");
        assert_eq!(reserve(&mut s, "quiet", "q", 0, &budgets).slot, 0);
        s.pause_budget("gateway", 5_500);
        assert_eq!(reserve(&mut s, "other", "o", 100, &budgets).slot, 5_500);
    }

    #[test]
    fn spread_places_out_of_order_events_by_what_the_window_holds() {
        let budgets = [budget(4, Placement::Spread, None)];
        let mut s = Scheduler::new();
        let slots: Vec<Millis> =
            (0..5).map(|i| reserve(&mut s, &format!("k{i}"), &format!("m{i}"), 0, &budgets).slot).collect();
        assert_eq!(slots, [0, 250, 500, 750, 1_000]);
    }

    /// A scheduler whose budgets forget their runs before every search gives the same slots: the
    /// runs only speed the search up.
    fn without_runs(s: &mut Scheduler) -> &mut Scheduler {
        s.budgets.values_mut().for_each(|b| b.runs.clear());
        s
    }

    #[test]
    fn a_calendar_full_far_ahead_is_walked_once_then_jumped() {
        let budgets = [budget(2, Placement::Start, None)];
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let reserve = |s: &mut Scheduler, key: &str| {
            s.reserve(
                "r",
                key,
                &ReserveRequest { max_delay: 1_000 * SECOND, budgets: &budgets, ..request("m", &limits, 0) },
            )
        };
        let mut s = Scheduler::new();
        // 1,000 tenants fill 500 windows; each search starts at now's window.
        for i in 0..1_000 {
            reserve(&mut s, &format!("k{i}"));
        }
        let run = s.budget_state("gateway").unwrap().runs[&SECOND];
        assert_eq!(run, FullRun { from: 0, through: 498_000, least: 2 }, "the last search walked to window 499");
        let mut plain = s.clone();
        assert_eq!(reserve(&mut s, "new").slot, 500_000);
        assert_eq!(reserve(without_runs(&mut plain), "new").slot, 500_000);
        assert_eq!(s.budget_state("gateway").unwrap().runs[&SECOND].through, 499_000, "extended by the window walked");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        #[test]
        fn runs_of_full_windows_never_change_a_slot(
            events in proptest::collection::vec((0u8..6, 1u64..4, 0i64..4_000, 0u8..3), 1..120),
            count in 2u64..6,
            adaptive_signals in proptest::collection::vec(0usize..120, 0..3),
            floors in proptest::option::of((0u64..=600_000, 0u64..=400_000)),
        ) {
            let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 200_000, step: 100_000, latency: None };
            let budget = Arc::new(Budget {
                limits: vec![
                    Limit::new(count, SECOND, Window::Fixed(Placement::Start)).unwrap(),
                    Limit::new(count * 3, 5 * SECOND, Window::Fixed(Placement::Spread)).unwrap(),
                ],
                adaptive: Some(adaptive),
                floors: floors.map_or_else(Vec::new, |(r0, r1)| vec![("r0".into(), r0), ("r1".into(), r1)]),
                ..(*budget(count, Placement::Start, None)).clone()
            });
            let budgets = [budget.clone()];
            let own = [Limit::new(3, 2 * SECOND, Window::Fixed(Placement::Start)).unwrap()];
            let (mut fast, mut plain) = (Scheduler::new(), Scheduler::new());
            let mut now = 0;
            for (i, (key, cost, step, margin)) in events.into_iter().enumerate() {
                now += step / 8;
                if adaptive_signals.contains(&i) {
                    fast.signal_budget(&budget, now);
                    plain.signal_budget(&budget, now);
                }
                let id = format!("m{i}");
                let request = ReserveRequest {
                    cost: cost.min(count),
                    max_delay: 60 * SECOND,
                    budgets: &budgets,
                    margin: Millis::from(margin) * 100,
                    ..request(&id, &own, now)
                };
                let (rule, key) = (format!("r{}", key % 3), format!("k{key}"));
                let a = fast.reserve(&rule, &key, &request);
                let b = without_runs(&mut plain).reserve(&rule, &key, &request);
                proptest::prop_assert_eq!((a.slot, a.status), (b.slot, b.status), "event {}", i);
            }
        }
    }

    fn reserve_for(s: &mut Scheduler, rule: &str, id: &str, now: Millis, budgets: &[Arc<Budget>]) -> Millis {
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let request = ReserveRequest { max_delay: 10 * SECOND, budgets, ..request(id, &limits, now) };
        s.reserve(rule, "k", &request).slot
    }

    #[test]
    fn a_floor_keeps_its_share_of_each_window_from_a_flood_booked_ahead() {
        let budgets = [Arc::new(Budget {
            floors: vec![("small".into(), 300_000)],
            ..(*budget(10, Placement::Start, None)).clone()
        })];
        let mut s = Scheduler::new();
        let flood: Vec<Millis> = (0..40).map(|i| reserve_for(&mut s, "big", &format!("b{i}"), 0, &budgets)).collect();
        // Window 0 has started (its floor is anyone's); later windows keep 3 of 10 for `small`.
        assert_eq!(flood.iter().filter(|&&t| t == 0).count(), 10);
        for window in [1_000, 2_000, 3_000, 4_000] {
            assert_eq!(flood.iter().filter(|&&t| t == window).count(), 7, "window {window}");
        }
        assert_eq!(flood.iter().filter(|&&t| t == 5_000).count(), 2);
        // `small` arrives after the flood and books its floor of the first window that has one.
        let small: Vec<Millis> =
            (0..4).map(|i| reserve_for(&mut s, "small", &format!("s{i}"), 500, &budgets)).collect();
        assert_eq!(small, [1_000, 1_000, 1_000, 2_000]);
        let state = s.budget_state("gateway").unwrap();
        assert_eq!(state.windows[&(SECOND, 1_000)], 10);
        assert_eq!(state.floor_used[&(SECOND, 2_000, "small".to_owned())], 1);
        // Without the floor, `small` would have waited behind the whole flood.
        let plain = [budget(10, Placement::Start, None)];
        let mut s = Scheduler::new();
        (0..40).for_each(|i| _ = reserve_for(&mut s, "big", &format!("b{i}"), 0, &plain));
        assert_eq!(reserve_for(&mut s, "small", "s0", 500, &plain), 4_000);
    }

    proptest::proptest! {
        /// Whatever another rule (with or without a floor of its own) booked ahead, a rule whose
        /// floor holds `units` of each window books `units / cost` events into every window that
        /// had not started: its i-th event lies no later than window `1 + i / (units / cost)`.
        #[test]
        fn a_floor_s_rule_books_its_floor_of_every_window_whatever_was_booked_ahead(
            count in 2u64..20,
            (floor, other) in (50_000u64..=PPM).prop_flat_map(|f| (Just(f), 0..=PPM - f)),
            flood in proptest::collection::vec(1u64..4, 0..200),
            small in 1usize..40,
            cost in 1u64..4,
        ) {
            let units = count * floor / PPM;
            proptest::prop_assume!(units >= cost);
            let floors = vec![("small".to_owned(), floor), ("big".to_owned(), other)];
            let budgets = [Arc::new(Budget { floors, ..(*budget(count, Placement::Start, None)).clone() })];
            let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
            let mut s = Scheduler::new();
            for (i, c) in flood.iter().enumerate() {
                let id = format!("b{i}");
                let request = ReserveRequest { cost: (*c).min(count), max_delay: 1_000 * SECOND, budgets: &budgets, ..request(&id, &limits, 0) };
                s.reserve("big", "k", &request);
            }
            for i in 0..small {
                let id = format!("s{i}");
                let request = ReserveRequest { cost, max_delay: 1_000 * SECOND, budgets: &budgets, ..request(&id, &limits, 500) };
                let slot = s.reserve("small", "k", &request).slot;
                let bound = (1 + i as u64 / (units / cost)) as Millis * SECOND;
                proptest::prop_assert!(slot <= bound, "event {} at {} after {:?}", i, slot, s.budget_state("gateway"));
            }
            let state = s.budget_state("gateway").unwrap();
            proptest::prop_assert!(state.windows.values().all(|&used| used <= count), "{:?}", state.windows);
        }
    }

    #[test]
    fn a_key_s_floor_is_held_for_that_key_not_for_the_rest_of_its_rule() {
        let budgets = [Arc::new(Budget {
            floors: vec![("sms|vip".into(), 300_000)],
            ..(*budget(10, Placement::Start, None)).clone()
        })];
        let reserve = |s: &mut Scheduler, key: &str, id: &str, now: Millis| {
            let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
            let request = ReserveRequest { max_delay: 10 * SECOND, budgets: &budgets, ..request(id, &limits, now) };
            s.reserve("sms", key, &request).slot
        };
        let mut s = Scheduler::new();
        // Another key of the same rule floods: it leaves `vip`'s 3 units of each later window.
        let flood: Vec<Millis> = (0..24).map(|i| reserve(&mut s, "bulk", &format!("b{i}"), 0)).collect();
        assert_eq!(flood.iter().filter(|&&t| t == 1_000).count(), 7);
        let vip: Vec<Millis> = (0..4).map(|i| reserve(&mut s, "vip", &format!("v{i}"), 500)).collect();
        assert_eq!(vip, [1_000, 1_000, 1_000, 2_000]);
        assert_eq!(s.budget_state("gateway").unwrap().floor_used[&(SECOND, 1_000, "sms|vip".to_owned())], 3);
        // A third key of the rule holds no floor: it waits behind the flood.
        assert_eq!(reserve(&mut s, "other", "o0", 500), 3_000);
    }

    #[test]
    fn an_unused_floor_is_anyone_s_once_its_window_starts() {
        let budgets = [Arc::new(Budget {
            floors: vec![("small".into(), 300_000)],
            ..(*budget(10, Placement::Start, None)).clone()
        })];
        let mut s = Scheduler::new();
        (0..38).for_each(|i| _ = reserve_for(&mut s, "big", &format!("b{i}"), 0, &budgets));
        // Before window 1s starts, another rule cannot borrow `small`'s 3 units there: it goes to
        // the first window with room beside the floor (5s, still empty).
        assert_eq!(reserve_for(&mut s, "other", "o0", 900, &budgets), 5_000);
        // Once it has started, they are free to whoever asks first.
        let started: Vec<Millis> =
            (1..5).map(|i| reserve_for(&mut s, "other", &format!("o{i}"), 1_000, &budgets)).collect();
        assert_eq!(started, [5_000, 5_000, 5_000, 5_000], "FIFO: `other`'s next events follow its first");
        assert_eq!(reserve_for(&mut s, "third", "t0", 1_000, &budgets), 1_000);
        assert_eq!(s.budget_state("gateway").unwrap().windows[&(SECOND, 1_000)], 8);
    }

    /// A rule of 10 a second with classes: `live` reserves 20% of each window. Entities are a key's
    /// classes (`<key>#<class>`), each its own FIFO; the key's calendar holds the limit.
    fn reserve_class(
        s: &mut Scheduler,
        (key, class): (&str, &str),
        id: &str,
        now: Millis,
        calendar: &Arc<Budget>,
    ) -> Millis {
        let draws = [calendar.clone()];
        let request = ReserveRequest {
            max_delay: 100 * SECOND,
            budgets: &draws,
            class: Some((key, class)),
            ..request(id, &[], now)
        };
        s.reserve("payouts", &format!("{key}#{class}"), &request).slot
    }

    /// A classes calendar of 10 a second per key, `live` reserving 20% of each window.
    fn live_reserve_calendar() -> Arc<Budget> {
        Arc::new(Budget {
            name: "payouts".into(),
            floors: vec![("live".into(), 200_000)],
            per_key: true,
            leases: None,
            ..(*budget(10, Placement::Start, None)).clone()
        })
    }

    #[test]
    fn classes_added_to_a_key_with_a_backlog_book_after_it_and_count_its_last_window() {
        let calendar = live_reserve_calendar();
        let mut s = Scheduler::new();
        // Before the rule had classes, the key's own state booked 25 events: 10, 10 and 5.
        let limits = calendar.limits.clone();
        for i in 0..25 {
            let id = format!("o{i}");
            s.reserve("payouts", "m", &ReserveRequest { max_delay: 100 * SECOND, ..request(&id, &limits, 0) });
        }
        let live = reserve_class(&mut s, ("m", "live"), "l0", 100, &calendar);
        assert_eq!(live, 2_000, "after the backlog, not in its full windows");
        let bulk: Vec<Millis> =
            (0..5).map(|i| reserve_class(&mut s, ("m", "bulk"), &format!("b{i}"), 100, &calendar)).collect();
        // Window 2 holds the backlog's 5 and live's 1: bulk takes 3 (live's unused unit of its
        // reserve of 2 stays free), then goes to 3s.
        assert_eq!(bulk, [2_000, 2_000, 2_000, 3_000, 3_000]);
        let state = s.budget_state(&calendar.state_name(Some("m"))).unwrap();
        assert_eq!((state.carried, state.windows[&(SECOND, 2_000)]), (Some(2_000), 9));
        // Another key had no backlog: nothing carried, its classes start now.
        assert_eq!(reserve_class(&mut s, ("n", "bulk"), "n0", 100, &calendar), 100);
        assert_eq!(s.budget_state(&calendar.state_name(Some("n"))).unwrap().carried, Some(0));
    }

    #[test]
    fn a_key_s_override_is_its_calendar_s_for_every_class_until_it_ends() {
        let calendar = live_reserve_calendar();
        let mut s = Scheduler::new();
        let id = override_id(&calendar.limits[0]);
        let raised = LimitOverride { limit: 20, until: Some(2_000) };
        assert_eq!(s.change_calendar_override(&calendar.state_name(Some("m")), &id, Some(raised)), None);
        let m: Vec<Millis> = (0..24)
            .map(|i| reserve_class(&mut s, ("m", ["bulk", "live"][i % 2]), &format!("m{i}"), 0, &calendar))
            .collect();
        // The count in force when they book is the override's: 20 in window 0, the other 4 in window 1.
        assert_eq!(m.iter().filter(|&&t| t == 0).count(), 20, "{m:?}");
        assert_eq!(m.iter().filter(|&&t| t == 1_000).count(), 4, "{m:?}");
        let n: Vec<Millis> =
            (0..11).map(|i| reserve_class(&mut s, ("n", "bulk"), &format!("n{i}"), 0, &calendar)).collect();
        assert_eq!(n.iter().filter(|&&t| t == 0).count(), 10, "another key keeps the rule's count");
        // A count below the cost refuses the event, for every class of the key.
        let lowered = LimitOverride { limit: 1, until: None };
        s.change_calendar_override(&calendar.state_name(Some("m")), &id, Some(lowered));
        let draws = [calendar.clone()];
        let request = ReserveRequest { cost: 2, budgets: &draws, class: Some(("m", "live")), ..request("big", &[], 0) };
        assert_eq!(s.reserve("payouts", "m#live", &request).status, Status::CostExceedsLimit);
        assert_eq!(s.change_calendar_override(&calendar.state_name(Some("m")), &id, None), Some(lowered));
    }

    #[test]
    fn a_class_with_a_reserve_overtakes_a_bulk_backlog_of_its_key_and_keys_stay_apart() {
        let calendar = live_reserve_calendar();
        let mut s = Scheduler::new();
        let bulk: Vec<Millis> =
            (0..26).map(|i| reserve_class(&mut s, ("m", "bulk"), &format!("b{i}"), 0, &calendar)).collect();
        assert_eq!(bulk.iter().filter(|&&t| t == 0).count(), 10, "the current window's reserve is anyone's");
        assert_eq!(bulk.iter().filter(|&&t| t == 1_000).count(), 8);
        assert_eq!(bulk.iter().filter(|&&t| t == 2_000).count(), 8);
        assert!(bulk.windows(2).all(|w| w[0] <= w[1]), "FIFO within the class");
        // A live payout published behind the bulk backlog goes in the next window, not after it.
        let live: Vec<Millis> =
            (0..3).map(|i| reserve_class(&mut s, ("m", "live"), &format!("l{i}"), 100, &calendar)).collect();
        assert_eq!(live, [1_000, 1_000, 2_000]);
        // Another merchant's calendar is its own.
        assert_eq!(reserve_class(&mut s, ("n", "bulk"), "n0", 100, &calendar), 100);
        let m = s.budget_state("payouts|m").unwrap();
        assert_eq!((m.windows[&(SECOND, 1_000)], m.floor_used[&(SECOND, 1_000, "live".to_owned())]), (10, 2));
        assert_eq!(s.budget_state("payouts|n").unwrap().windows[&(SECOND, 0)], 1);
    }

    #[test]
    fn an_adaptive_budget_counts_less_after_a_signal() {
        let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 100_000, step: 100_000, latency: None };
        let budget = Arc::new(Budget { adaptive: Some(adaptive), ..(*budget(10, Placement::Start, None)).clone() });
        let budgets = [budget.clone()];
        let mut s = Scheduler::new();
        s.signal_budget(&budget, 0);
        let slots: Vec<Millis> =
            (0..6).map(|i| reserve(&mut s, &format!("k{i}"), &format!("m{i}"), 100, &budgets).slot).collect();
        assert_eq!(slots, [100, 100, 100, 100, 100, 1_000], "5 of 10 in the window of the signal");
    }
}
