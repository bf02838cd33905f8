//! Where reservations live: Redis in production (`reserve.lua`, atomic across every instance, one
//! call for each group of reservations that arrive together), or memory (the reference model) for the simulator and tests.

pub mod args;
mod budgets;
mod connection;
mod group_commit;
pub mod inspect;
mod keys;
mod memory;
mod overrides;
mod redis_store;
mod resume;
mod scripts;
mod store;

use std::sync::Arc;

use drip_core::schedule::{Reservation, ReserveRequest};
use drip_core::time::Millis;

pub use connection::{AnyConnection, ConnectError, RedisSettings, TokenAuth, TokenFuture, TokenSource};
pub use group_commit::Batching;
pub use keys::{ANSWER_BUCKET, EntityKeys, RuleRef, budget_key, dispatch_key, field};
pub use memory::MemoryStore;
pub use overrides::{AuditEntry, Author, FeedbackChange, OverrideChange, OverrideView, ResumeChange};
pub use redis_store::{
    ANSWER_MARGIN, DISPATCHED_MEMORY, DispatchClaim, MessageOf, RedisStore, ReserveCall, STATE_MARGIN, parse_replies,
    parse_reply, reserve_script,
};
pub use resume::{Resumed, resume};
pub use store::{Ping, Store, StoreFuture};

/// One event's reservation request for one entity: the model's request ([`ReserveRequest`], the
/// event's parameters) with where the store files it and which clock decides it.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    pub rule: &'a str,
    pub key: &'a str,
    /// The hash tag of the rule's budgets (`RuleRef::tag`), if it draws from any.
    pub tag: Option<&'a str>,
    /// Give a message that already has an answer a new slot (its attempt holds the lease and was
    /// told to wait by the downstream); false for an ordinary reservation.
    pub reslot: bool,
    /// The event as the model reserves it. Its `message_id` is the message's identity
    /// (`MessageRef::identity`: id and subscription); its `now` counts only when `store_clock` is
    /// false.
    pub event: ReserveRequest<'a>,
    /// Decide at the store's clock (Redis `TIME`, so instances with skewed clocks agree) instead
    /// of `event.now`.
    pub store_clock: bool,
}

impl<'a> SlotRequest<'a> {
    /// The rule the request's entity belongs to, as keys name it.
    pub fn rule_ref(&self) -> RuleRef<'a> {
        RuleRef { id: self.rule, tag: self.tag }
    }

    /// `event` for `key` of `rule`, on the store's clock, not a reslot, no budget tag.
    pub fn new(rule: &'a str, key: &'a str, event: ReserveRequest<'a>) -> Self {
        Self { rule, key, tag: None, reslot: false, event, store_clock: true }
    }

    /// The request for one event of `rule` (its limits, budgets and the rest, as
    /// `ReserveRequest::for_rule` gives them), on the store's clock.
    pub fn for_rule(rule: &'a drip_core::rules::Rule, key: &'a str, message_id: &'a str, cost: u64) -> Self {
        Self { tag: rule.budget_tag(), ..Self::new(&rule.id, key, ReserveRequest::for_rule(rule, message_id, cost, 0)) }
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
