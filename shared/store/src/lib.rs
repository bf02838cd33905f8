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
mod scripts;
mod store;

use std::sync::Arc;

use drip_core::budgets::{Adaptive, Budget};
use drip_core::rules::Limit;
use drip_core::schedule::Reservation;
use drip_core::time::Millis;

pub use connection::{AnyConnection, RedisSettings, TokenAuth, TokenFuture, TokenSource};
pub use group_commit::Batching;
pub use keys::{ANSWER_BUCKET, EntityKeys, RuleRef, budget_key, dispatch_key, field};
pub use memory::MemoryStore;
pub use overrides::{AuditEntry, Author, FeedbackChange, OverrideChange, OverrideView};
pub use redis_store::{
    ANSWER_MARGIN, DISPATCHED_MEMORY, DispatchClaim, MessageOf, RedisStore, ReserveCall, STATE_MARGIN, parse_replies,
    parse_reply, reserve_script,
};
pub use store::{Ping, Store, StoreFuture};

/// One event's reservation request for one entity.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    pub rule: &'a str,
    pub key: &'a str,
    /// The message's identity (`MessageRef::identity`: id and subscription).
    pub message_id: &'a str,
    pub cost: u64,
    pub limits: &'a [Limit],
    pub max_delay: Millis,
    /// `None`: the store's clock (Redis `TIME`), so instances with skewed clocks agree.
    pub now: Option<Millis>,
    /// How long the attempt that gets the answer acts alone on the message (0: no lease).
    pub lease: Millis,
    /// When the message was published (the same on every redelivery): its answer is filed under
    /// its minute. `None`: undated (a message not from Pub/Sub), filed with the entity's undated
    /// answers, so a redelivery in another minute still finds it.
    pub published: Option<Millis>,
    /// Give a message that already has an answer a new slot (its attempt holds the lease and was
    /// told to wait by the downstream); false for an ordinary reservation.
    pub reslot: bool,
    /// The entity's frontier is at least this (the same subject's last slot under the rule's
    /// `previous_key`, read first: a key template change keeps FIFO and the window bound).
    pub floor: Option<Millis>,
    /// The hash tag of the rule's budgets (`RuleRef::tag`), if it draws from any.
    pub tag: Option<&'a str>,
    /// The shared budgets the event also draws from.
    pub budgets: &'a [Arc<Budget>],
    /// The rule's adaptive limit, if it has one.
    pub adaptive: Option<Adaptive>,
    /// The rule's `delivery_margin` (`ReserveRequest::margin`).
    pub margin: Millis,
}

impl<'a> SlotRequest<'a> {
    /// The rule the request's entity belongs to, as keys name it.
    pub fn rule_ref(&self) -> RuleRef<'a> {
        RuleRef { id: self.rule, tag: self.tag }
    }

    /// A request of cost 1 for `message_id` under `limits`, with a minute's `max_delay`, on the
    /// store's clock: undated, no lease, reslot, floor, budget, adaptive limit or margin. Callers
    /// change what they need with `..SlotRequest::new(..)`, so a new parameter has one default,
    /// here (as `ReserveRequest::new` in the model).
    pub fn new(rule: &'a str, key: &'a str, message_id: &'a str, limits: &'a [Limit]) -> Self {
        Self {
            rule,
            key,
            message_id,
            cost: 1,
            limits,
            max_delay: drip_core::time::MINUTE,
            now: None,
            lease: 0,
            published: None,
            reslot: false,
            floor: None,
            tag: None,
            budgets: &[],
            adaptive: None,
            margin: 0,
        }
    }

    /// The request for one event of `rule`, with the rule's limits and max_delay.
    pub fn for_rule(
        rule: &'a drip_core::rules::Rule,
        key: &'a str,
        message_id: &'a str,
        cost: u64,
        now: Option<Millis>,
    ) -> Self {
        Self {
            cost,
            max_delay: rule.max_delay,
            now,
            published: now,
            tag: rule.budget_tag(),
            budgets: &rule.budgets,
            adaptive: rule.adaptive,
            margin: rule.delivery_margin,
            ..Self::new(&rule.id, key, message_id, &rule.limits)
        }
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
