//! What a reservation asks of a store and what it gets back: the types every other module of the
//! store speaks, depending on none of them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use drip_core::schedule::{OldSlot, Reservation, ReserveRequest};
use drip_core::time::Millis;

use crate::keys::RuleRef;

/// One event's reservation request for one entity: the model's request ([`ReserveRequest`], the
/// event's parameters) with where the store files it and which clock decides it.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    pub rule: &'a str,
    pub key: &'a str,
    /// The hash tag of the rule's budgets (`RuleRef::tag`), if it draws from any.
    pub tag: Option<&'a str>,
    /// Give a message that already has an answer a new slot (its attempt holds the lease and was
    /// told to wait by the downstream, found a pause, or came too late), its old slot's units kept
    /// or given back; `None` for an ordinary reservation.
    pub reslot: Option<OldSlot>,
    /// The drain of the key's parked messages, at this one (`Scheduler::unpark`): its slot is
    /// reserved if no later than this deadline. `reslot` is not read then.
    pub unpark: Option<Millis>,
    /// The event as the model reserves it. Its `message_id` is the message's identity
    /// (`MessageRef::identity`: id and subscription); its `now` counts only when `store_clock` is
    /// false.
    pub event: ReserveRequest<'a>,
    /// Decide at the store's clock (Redis `TIME`, so instances with skewed clocks agree) instead
    /// of `event.now`.
    pub store_clock: bool,
    /// The body to keep for the key's drain should the message park (the task body it would have
    /// had): kept in the call that parks it, so that a parked message never waits without its body
    /// and its parking costs no second trip ([`Reserved::body_kept`]). `None`: the caller keeps it
    /// after (`Store::park_body`), as for a body over [`MAX_BODY_KEPT_IN_CALL`].
    pub parked_body: Option<&'a [u8]>,
}

/// The largest body a reservation call carries to keep should its message park
/// ([`SlotRequest::keeping_if_parked`]). The call carries it whether the message parks or not,
/// and a parked one keeps it in its queue entry, which the drain moves through the script: past
/// about this size that costs Redis more than the caller's second trip to keep the body of a
/// message that parked (docs/capacity.md, "A fair budget under a deep backlog").
pub const MAX_BODY_KEPT_IN_CALL: usize = 2048;

/// A parked message's body, as its key's queue or handing list holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedBody {
    pub body: Vec<u8>,
    /// Kept in the message's entry (the call that parked it carried it), not beside it: what the
    /// message's hand-over is told (`Store::handed_over`).
    pub in_entry: bool,
}

impl ParkedBody {
    /// The request `request` as its hand-over takes it: with this body when its entry keeps it.
    pub fn handed_over<'a>(&'a self, request: SlotRequest<'a>) -> SlotRequest<'a> {
        SlotRequest { parked_body: self.in_entry.then_some(self.body.as_slice()), ..request }
    }
}

impl<'a> SlotRequest<'a> {
    /// The rule the request's entity belongs to, as keys name it.
    pub fn rule_ref(&self) -> RuleRef<'a> {
        let leases = self.event.budgets.iter().find_map(|b| b.leases);
        // A bare key drawing from its key's calendar as the default class is its own entity.
        let classed = self.event.class.is_some_and(|(scope, _)| scope != self.key);
        RuleRef { id: self.rule, tag: self.tag, leases, classed }
    }

    /// `event` for `key` of `rule`, on the store's clock, not a reslot, no budget tag.
    pub fn new(rule: &'a str, key: &'a str, event: ReserveRequest<'a>) -> Self {
        Self { rule, key, tag: None, reslot: None, unpark: None, event, store_clock: true, parked_body: None }
    }

    /// The request for one event of `rule` (its limits, budgets and the rest, as
    /// `ReserveRequest::for_rule` gives them), on the store's clock.
    ///
    /// For a rule with classes, `key` is the entity `<key>#<class>` (`Classes::entity`, as routing
    /// makes it): the event draws from its key's calendar. A bare key there (what it parked, or a
    /// task it booked, before the rule had classes) draws from it as the default class
    /// (`Classes::of_entity`).
    pub fn for_rule(rule: &'a drip_core::rules::Rule, key: &'a str, message_id: &'a str, cost: u64) -> Self {
        let mut event = ReserveRequest::for_rule(rule, message_id, cost, 0);
        if let Some(classes) = &rule.classes {
            event = event.for_class(rule, classes.of_entity(key));
        }
        Self { tag: rule.budget_tag(), ..Self::new(&rule.id, key, event) }
    }

    /// The key the entity belongs to: for a class's entity `<key>#<class>`, its key (whose
    /// partition, ring and calendar it shares); else the entity's own.
    pub fn scope(&self) -> &'a str {
        self.event.scope(self.key)
    }

    /// The same request decided at `now` instead of the store's clock (tests, the simulator).
    pub fn at(self, now: Millis) -> Self {
        Self { event: ReserveRequest { now, ..self.event }, store_clock: false, ..self }
    }

    /// The same request for a message published at `published` (its answer is filed under that
    /// minute; `None`: undated).
    pub fn published(self, published: Option<Millis>) -> Self {
        Self { event: ReserveRequest { published, ..self.event }, ..self }
    }

    /// The same request keeping `body` for the key's drain should the message park, when it is at
    /// most [`MAX_BODY_KEPT_IN_CALL`]: a larger one is the caller's to keep after, if the message
    /// parked ([`Reserved::body_kept`] says so).
    pub fn keeping_if_parked(self, body: &'a [u8]) -> Self {
        if body.len() > MAX_BODY_KEPT_IN_CALL {
            return self;
        }
        Self { parked_body: Some(body), ..self }
    }

    /// When to decide: `None` is the store's clock.
    pub fn now(&self) -> Option<Millis> {
        (!self.store_clock).then_some(self.event.now)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub reservation: Reservation,
    /// The store's time of this call (for a redelivery, later than `reservation.decided_at`).
    pub now: Millis,
    /// The message parked and, in the same call, armed its fair budget's ring's drain (none was
    /// armed): the caller makes the wake's task, at the slot less the budget's near horizon, no
    /// earlier than now and at most `MAX_WAKE_GAP` ahead ([`Reserved::ring_wake`]).
    pub armed: bool,
}

impl Reserved {
    /// When a drain wanted at `wanted` wakes, as the scripts arm one: no earlier than this call's
    /// now, at most `MAX_WAKE_GAP` after it.
    pub fn wake_at(&self, wanted: Millis) -> Millis {
        wanted.clamp(self.now, self.now + drip_core::schedule::MAX_WAKE_GAP)
    }

    /// When the ring's drain should wake for this parked message of a fair budget whose near
    /// horizon is `near`: as the reservation armed it.
    pub fn ring_wake(&self, near: Millis) -> Millis {
        self.wake_at(self.reservation.slot - near)
    }

    /// Whether the call that answered `request` kept its parked body: it parked the message now
    /// (a replayed answer's attempt may have died before its body was kept, or kept none).
    pub fn body_kept(&self, request: &SlotRequest<'_>) -> bool {
        request.parked_body.is_some()
            && self.reservation.status == drip_core::schedule::Status::Parked
            && self.reservation.attempt == drip_core::schedule::Attempt::Decided
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from reserve.lua: {0}")]
    UnexpectedReply(String),
    /// The script call that carried this event with others failed.
    #[error("{0}")]
    Batch(Arc<StoreError>),
}

/// What every store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The time a store decides operations at that carry no time of their own (overrides, pauses,
/// signals, latency reports): its own (Redis `TIME`, so instances with skewed clocks agree; the
/// wall clock for the model) until a caller sets one (tests, the simulator). Clones share it.
#[derive(Debug, Clone)]
pub struct Clock(Arc<std::sync::atomic::AtomicI64>);

/// What a `Clock` holds while it reads the store's own time.
const OWN_TIME: Millis = Millis::MIN;

impl Default for Clock {
    fn default() -> Self {
        Self(Arc::new(std::sync::atomic::AtomicI64::new(OWN_TIME)))
    }
}

impl Clock {
    /// From now on the store decides at `at` (until it is set again).
    pub fn set(&self, at: Millis) {
        self.0.store(at, std::sync::atomic::Ordering::SeqCst);
    }

    /// The time set, or `None`: the store's own.
    pub fn now(&self) -> Option<Millis> {
        Some(self.0.load(std::sync::atomic::Ordering::SeqCst)).filter(|&at| at != OWN_TIME)
    }
}
