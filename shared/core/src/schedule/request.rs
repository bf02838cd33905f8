//! What a reservation is asked and what it answers: the request (an event of a rule, its key, cost
//! and the moment), the status and correction of an answer, and what a rule's fields mean for one.

use super::*;

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
    /// The cost of the events behind this one in its call (a store's batch), by the leased pool
    /// they draw from ([`Budget::pool_name`]): a lease this one asks for asks for them too.
    pub queued: &'a [(String, u64)],
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
            queued: &[],
        }
    }

    /// The key the entity `key` belongs to: for a class's entity, its key (whose partition, ring
    /// and calendar its classes share); else `key` itself.
    pub fn scope<'k>(&self, key: &'k str) -> &'k str
    where
        'a: 'k,
    {
        self.class.map_or(key, |(scope, _)| scope)
    }

    /// The leased pools the event of `key` draws from ([`Budget::pool_name`]).
    pub fn leased_pools(&self, key: &str) -> impl Iterator<Item = String> + '_ {
        let scope = self.scope(key).to_owned();
        self.budgets.iter().filter_map(move |b| Some(b.pool_name(b.partition_of(&scope)?)))
    }

    /// The same request for an event of `rule`'s class `class` of `key`: the rule's limits are the
    /// key's calendar (`Classes::calendar`, first of `budgets`), none on the entity itself. A rule
    /// without classes keeps the request as it is.
    pub fn for_class(self, rule: &'a Rule, (key, class): (&'a str, &'a str)) -> Self {
        match &rule.classes {
            Some(classes) => {
                // The rule's adaptive level is the calendar's (`Classes::calendar`), not the entity's.
                Self { limits: &[], budgets: &classes.draws, class: Some((key, class)), adaptive: None, ..self }
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

/// How late a sliding or gcra event may be delivered before it counts as late (without a larger
/// `delivery_margin`): the jitter of a Cloud Tasks dispatch. An event later than that has met a
/// fault (a crash, a retried create or publish) and takes a new slot; a few milliseconds of
/// jitter must not send every event of a backlog to its end.
pub const DISPATCH_JITTER: Millis = crate::time::SECOND;

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
