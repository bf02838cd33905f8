//! A throttled key's backlog parks (`park_horizon`): when an event parks instead of booking,
//! and the wake that drains the queue at the rate in force.

use super::*;

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
    /// The message is not parked: its answer is a decided one (a concurrent drain took it, or it
    /// never parked). Nothing changed.
    NotParked,
    /// The message is not at the head of the queue: parked further back, or, its answer gone,
    /// perhaps parked (only the whole queue could tell, and nothing reads it for that). Nothing
    /// changed.
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

/// Whether an event of the entity whose earliest slot is `slot` parks instead of booking it: its
/// rule parks, and messages of the key are parked already (FIFO), or the key is throttled (paused,
/// or its adaptive level below the ceiling; or one of its budgets, `budget_throttled`) and the
/// slot lies past the park horizon, or it draws from a fair budget and the slot lies past that
/// budget's near horizon ([`Budget::near`]: book near, park far).
pub(super) fn parks(state: &EntityState, budget_throttled: bool, request: &ReserveRequest<'_>, slot: Millis) -> bool {
    let Some(horizon) = request.park else { return false };
    let paused = state.paused_until.is_some_and(|until| until > request.now);
    let lowered = request
        .adaptive
        .is_some_and(|a| a.level(state.adaptive, adaptive_window(request.limits), request.now) < a.ceiling());
    let far = request.budgets.iter().filter_map(|b| b.near()).any(|near| slot > request.now + near);
    state.parked > 0 || ((paused || lowered || budget_throttled) && slot > request.now + horizon) || far
}

/// Whether a budget the request draws from is paused, or its adaptive level below its ceiling.
pub(super) fn throttled_budget(
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

/// The message (its earliest slot `slot`) joins the end of its key's queue, and at the key's first
/// park the key its fair budgets' rings in the same step, so that a parked key is in its fair
/// budget's ring (a key parked before its rule's budget was fair joins when its queue has
/// emptied; its own wake drains it meanwhile); the ring's drain is armed where the slot comes
/// within the budget's near horizon, unless a wake is armed: the wake armed, if one was.
pub(super) fn queue(
    entity: &mut Entity,
    rings: &mut HashMap<String, fair::RingState>,
    (rule, key): (&str, &str),
    request: &ReserveRequest<'_>,
    slot: Millis,
) -> Option<Millis> {
    let joins = entity.state.parked == 0;
    entity.queue.push_back(answer_file(request.message_id, request.published));
    entity.state.parked += 1;
    let mut armed = None;
    let member = crate::fair::Member { rule: rule.into(), key: key.into() };
    for budget in request.budgets.iter().filter(|b| b.fair.is_some()) {
        let ring = crate::budgets::FairRing::of_key(budget, request.scope(key)).name();
        if joins {
            fair::join(rings, &ring, &member, request.now);
        }
        let wanted = slot - budget.near().unwrap_or_default();
        armed = armed.or(fair::arm(rings, &ring, request.now, wanted));
    }
    armed
}

impl Scheduler {
    /// A new event of a key whose messages are parked already waits behind them (FIFO, as
    /// [`parks`] says) without a slot of its own: nothing is searched or booked, so its cost, its
    /// `max_delay` (from now) and the counts in force are the drain's to judge at the head of
    /// the queue ([`Self::unpark`]). Its answer's slot is now.
    pub(super) fn park_behind(&mut self, rule: &str, key: &str, request: &ReserveRequest<'_>) -> Reservation {
        let entity = self.entities.entry((rule.to_owned(), key.to_owned())).or_default();
        self.armed = queue(entity, &mut self.rings, (rule, key), request, request.now);
        file_decision(entity, request, request.now, Status::Parked)
    }
}

/// How many heads that stayed (their slots past the drain's deadline), with none booked after
/// them, end a drain's turn ([`full_through_deadline`]).
pub const FULL_AFTER: usize = 16;

/// Whether a drain's unparks, in the order one call made them, end in [`FULL_AFTER`] heads or
/// more that stayed with nothing booked after the first of them: the budget is full through the
/// deadline, so every other waiting key's head would stay too. The drain stops there rather than
/// try each waiting key once more (one wasted unpark per key a wake: with a thousand keys
/// waiting, a quarter of a drain's work). Only the plan changes: what is booked, and where, is
/// the ordinary arithmetic's; the keys not tried keep their place for the next wake.
pub fn full_through_deadline<'a>(unparks: impl DoubleEndedIterator<Item = &'a Unpark>) -> bool {
    let stayed = unparks
        .rev()
        .take_while(|u| !matches!(u, Unpark::Decided(_)))
        .filter(|u| matches!(u, Unpark::Later { .. }))
        .count();
    stayed >= FULL_AFTER
}

impl Scheduler {
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
            None => return Unpark::NotHead,
            Some(_) => return Unpark::NotParked,
        };
        if entity.queue.front() != Some(&file) {
            return Unpark::NotHead;
        }
        // What is left of its max_delay, from when it was parked (negative once it has passed).
        let request = ReserveRequest { max_delay: since + request.max_delay - request.now, park: None, ..*request };
        let (exceeded, slot) = self.earliest(rule, key, &request, Some(deadline));
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Placement, Window};
    use crate::time::{MINUTE, SECOND};

    #[test]
    fn a_drain_s_turn_ends_at_a_run_of_heads_that_stayed() {
        let later = Unpark::Later { slot: 2_000, wake: 1_500 };
        let decided = Unpark::Decided(Reservation {
            slot: 1_000,
            status: Status::Reserved,
            decided_at: 0,
            attempt: Attempt::Decided,
        });
        let run = |booked: usize, stayed: usize| {
            let mut unparks = vec![decided; booked];
            for i in 0..stayed {
                unparks.push(if i % 4 == 3 { Unpark::NotHead } else { later });
            }
            unparks
        };
        assert!(!full_through_deadline(run(100, 20).iter()), "15 stayed, 5 behind a head that stayed");
        assert!(full_through_deadline(run(100, 22).iter()), "17 stayed");
        let mut booked_after = run(10, 40);
        booked_after.push(decided);
        assert!(!full_through_deadline(booked_after.iter()), "a head booked after them: room is left");
        assert!(!full_through_deadline(run(0, 0).iter()));
    }

    #[test]
    fn an_event_behind_parked_ones_waits_unsearched_and_the_drain_judges_it_at_the_head() {
        let limits = [Limit::new(1, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let limits = &limits;
        let request = move |id: &'static str, now, cost, max_delay| ReserveRequest {
            park: Some(SECOND),
            max_delay,
            cost,
            ..ReserveRequest::new(id, limits, now)
        };
        let mut s = Scheduler::new();
        s.pause("r", "k", 5_000);
        let head = s.reserve("r", "k", &request("a", 0, 1, MINUTE));
        assert_eq!((head.status, head.slot), (Status::Parked, 5_000), "the first one searched");
        // Behind it: parked at once, slot now, even a cost over the count or a max_delay the
        // pause alone breaks (a key with nothing parked refuses both at arrival).
        let over = s.reserve("r", "k", &request("b", 100, 2, MINUTE));
        assert_eq!((over.status, over.slot), (Status::Parked, 100));
        let late = s.reserve("r", "k", &request("c", 200, 1, SECOND));
        assert_eq!((late.status, late.slot), (Status::Parked, 200));
        let fits = s.reserve("r", "k", &request("d", 300, 1, MINUTE));
        assert_eq!((fits.status, fits.slot), (Status::Parked, 300));
        assert_eq!(s.reserve("r", "k2", &request("e", 300, 2, MINUTE)).status, Status::CostExceedsLimit);
        assert_eq!(s.entity_state("r", "k").unwrap().parked, 4);
        assert_eq!(s.entity_state("r", "k").unwrap().last_slot, None, "nothing booked");
        // The drain: the head books where the pause ends, the next two leave with nothing
        // reserved, and the last books behind the head.
        let drained: Vec<_> = [("a", 1, MINUTE), ("b", 2, MINUTE), ("c", 1, SECOND), ("d", 1, MINUTE)]
            .into_iter()
            .map(|(id, cost, max_delay)| match s.unpark("r", "k", &request(id, 5_000, cost, max_delay), 7_000) {
                Unpark::Decided(r) => (r.status, r.slot),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            drained,
            [
                (Status::Reserved, 5_000),
                (Status::CostExceedsLimit, 5_000),
                (Status::MaxDelayExceeded, 6_000),
                (Status::Reserved, 6_000)
            ]
        );
        assert_eq!(s.entity_state("r", "k").unwrap().parked, 0);
    }
}
