//! What the limiter needs of a store, as one object-safe trait, so its handlers run over Redis in
//! production and over the reference model in tests that need no services.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use drip_core::budgets::Budget;
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::LimitOverride;
use drip_core::time::{Millis, wall_clock_millis};
use redis::aio::ConnectionLike;

use crate::inspect::{EntityReport, report};
use crate::{
    FeedbackChange, MemoryStore, MessageOf, OverrideChange, RedisStore, Reserved, RuleRef, SlotRequest, SlotStore,
    StoreError,
};

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// `/readyz`: whether the store answers.
pub trait Ping: Send + Sync {
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// Reservations, claim-checks and inspection: everything the limiter asks of its store.
pub trait LimiterStore: Ping + std::fmt::Debug {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved>;
    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()>;
    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()>;
    /// Keeps a payload too large for a task until its dispatch; returns the task's reference to it.
    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], ttl: Millis) -> StoreFuture<'a, String>;
    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport>;
    /// Sets (`Some`) or deletes (`None`) the entity's override of `limit`, recording who did it.
    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: &'a str,
    ) -> StoreFuture<'a, OverrideChange>;
    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>>;
    /// No slot of the entity before `until` (the downstream said to wait).
    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()>;
    /// No slot of any entity drawing from the budget before `until`.
    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()>;
    /// A 429, 5xx or timeout from the entity's downstream: its adaptive level drops, if the rule
    /// has one (returns it, ppm).
    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>>;
    /// The same for a budget's adaptive level.
    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>>;
    /// The entity's last slot, if it remembers one.
    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>>;
    /// The latest end of a pause of the key or of one of its rule's budgets, if any.
    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>>;
    /// Keeps a `/v1/feedback` call in its rule's audit list.
    fn record_feedback<'a>(&'a self, change: &'a FeedbackChange) -> StoreFuture<'a, ()>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Ping for RedisStore<C> {
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut self.connection()).await?;
            Ok(())
        })
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + std::fmt::Debug + 'static> LimiterStore for RedisStore<C> {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(SlotStore::reserve(self, request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(SlotStore::complete(self, request, reserved))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(SlotStore::release(self, request, reserved))
    }

    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], ttl: Millis) -> StoreFuture<'a, String> {
        Box::pin(RedisStore::put_payload(self, of, payload, ttl))
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        Box::pin(RedisStore::inspect(self, rule, key))
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: &'a str,
    ) -> StoreFuture<'a, OverrideChange> {
        let rule = RuleRef::of(rule);
        Box::pin(async move {
            match set {
                Some(set) => self.set_override(rule, key, limit, set, by, None).await,
                None => self.delete_override(rule, key, limit, by, None).await,
            }
        })
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        Box::pin(RedisStore::overrides(self, RuleRef::of(rule), key))
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::pause(self, RuleRef::of(rule), key, until, None))
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::pause_budget(self, budget, until, None))
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        Box::pin(async move {
            let Some(adaptive) = &rule.adaptive else { return Ok(None) };
            RedisStore::signal(self, RuleRef::of(rule), key, (adaptive, &rule.limits), None).await.map(Some)
        })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        Box::pin(RedisStore::signal_budget(self, budget, None))
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(RedisStore::frontier(self, RuleRef::of(rule), key))
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(RedisStore::paused_until(self, rule, key))
    }

    fn record_feedback<'a>(&'a self, change: &'a FeedbackChange) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::record_feedback(self, change))
    }
}

/// The reference model with claim-checked payloads in a map: one process, no persistence.
#[derive(Debug, Default)]
pub struct MemoryLimiterStore {
    pub model: MemoryStore,
    payloads: Mutex<HashMap<String, Vec<u8>>>,
    feedback: Mutex<Vec<FeedbackChange>>,
}

impl MemoryLimiterStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The feedback calls recorded, oldest first.
    pub fn feedback_history(&self) -> Vec<FeedbackChange> {
        self.feedback.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A payload `put_payload` kept, by its reference.
    pub fn payload(&self, reference: &str) -> Option<Vec<u8>> {
        self.payloads.lock().unwrap_or_else(|e| e.into_inner()).get(reference).cloned()
    }
}

impl Ping for MemoryLimiterStore {
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

impl LimiterStore for MemoryLimiterStore {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(self.model.reserve(request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(self.model.complete(request, reserved))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(self.model.release(request, reserved))
    }

    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], _: Millis) -> StoreFuture<'a, String> {
        let reference = format!("memory:{}|{}|{}", of.rule, of.key, of.message);
        self.payloads.lock().unwrap_or_else(|e| e.into_inner()).insert(reference.clone(), payload.to_vec());
        Box::pin(async move { Ok(reference) })
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        let state = self.model.entity_state(&rule.id, key).unwrap_or_default();
        let budgets: Vec<_> =
            rule.budgets.iter().map(|b| (b.clone(), self.model.budget_state(&b.name).unwrap_or_default())).collect();
        Box::pin(async move { Ok(report(rule, key, wall_clock_millis(), &state, &budgets)) })
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: &'a str,
    ) -> StoreFuture<'a, OverrideChange> {
        let before = match set {
            Some(set) => self.model.set_override(&rule.id, key, limit, set),
            None => self.model.delete_override(&rule.id, key, limit),
        };
        let change = OverrideChange::new(wall_clock_millis(), by, (&rule.id, key, limit), before, set);
        Box::pin(async move { Ok(change) })
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        let overrides = self.model.entity_state(&rule.id, key).map(|s| s.overrides).unwrap_or_default();
        Box::pin(async move { Ok(overrides) })
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        self.model.pause(&rule.id, key, until);
        Box::pin(async { Ok(()) })
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        self.model.pause_budget(budget, until);
        Box::pin(async { Ok(()) })
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        let level = rule.adaptive.map(|a| self.model.signal(&rule.id, key, (&a, &rule.limits), wall_clock_millis()));
        Box::pin(async move { Ok(level) })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        let level = self.model.signal_budget(budget, wall_clock_millis());
        Box::pin(async move { Ok(level) })
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let last = self.model.entity_state(&rule.id, key).and_then(|state| state.last_slot);
        Box::pin(async move { Ok(last) })
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let own = self.model.entity_state(&rule.id, key).and_then(|state| state.paused_until);
        let budgets = rule.budgets.iter().filter_map(|b| self.model.budget_state(&b.name).and_then(|s| s.paused_until));
        let until = own.into_iter().chain(budgets).max();
        Box::pin(async move { Ok(until) })
    }

    fn record_feedback<'a>(&'a self, change: &'a FeedbackChange) -> StoreFuture<'a, ()> {
        self.feedback.lock().unwrap_or_else(|e| e.into_inner()).push(change.clone());
        Box::pin(async { Ok(()) })
    }
}
