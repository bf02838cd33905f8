//! What the services need of a store, as one object-safe trait, implemented by Redis
//! (`RedisStore`) and by the reference model (`MemoryStore`), so both services' handlers run over
//! Redis in production and over the model in tests that need no services.

use std::collections::BTreeMap;

use drip_core::budgets::{Budget, LatencyChange, LatencyReport};
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::{Correction, LimitOverride};
use drip_core::time::{Millis, wall_clock_millis};
use redis::aio::ConnectionLike;

use crate::inspect::{EntityReport, report};
use crate::overrides::Author;
use crate::{
    AuditEntry, Calendar, DispatchClaim, MemoryStore, MessageOf, OverrideChange, RedisStore, Reserved, RuleRef,
    SlotRequest, StoreFuture,
};

/// `/readyz`: whether the store answers.
pub trait Ping: Send + Sync {
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// Reservations, claim-checks, overrides, pauses, signals, dispatch claims and inspection:
/// everything either service asks of its store.
pub trait Store: Ping + std::fmt::Debug {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved>;
    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()>;
    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()>;
    /// Corrects what the request's message booked with the cost reported after its call, once.
    fn correct_cost<'a>(&'a self, request: &'a SlotRequest<'a>, actual: u64) -> StoreFuture<'a, Correction>;
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
        by: Author<'a>,
    ) -> StoreFuture<'a, OverrideChange>;
    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>>;
    /// Every key of the rule with overrides, and its overrides.
    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>>;
    /// The rule's latest override changes and feedback calls, newest first.
    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<AuditEntry>>;
    /// No slot of the entity before `until` (the downstream said to wait).
    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()>;
    /// No slot of any entity drawing from the budget before `until`.
    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()>;
    /// Lifts the entity's pause (an operator's resume); returns when it would have ended.
    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>>;
    /// Lifts the budget's pause; returns when it would have ended.
    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>>;
    /// A 429, 5xx or timeout from the entity's downstream: its adaptive level drops, if the rule
    /// has one (returns it, ppm).
    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>>;
    /// The same for a budget's adaptive level.
    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>>;
    /// A window's latency of the entity's downstream: its adaptive level follows it, if the rule's
    /// adaptive limit follows latency (returns what the report did).
    fn report_latency<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>>;
    /// The same for a budget.
    fn report_budget_latency<'a>(
        &'a self,
        budget: &'a Budget,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>>;
    /// The entity's last slot, if it remembers one.
    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>>;
    /// The latest end of a pause of the key or of one of its rule's budgets, if any.
    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>>;
    /// Keeps a `/v1/feedback` call or a resume in its rule's audit list.
    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()>;
    /// The payload a task refers to, or `None` when it expired or never existed.
    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>>;
    /// Keeps a claim-checked payload at least `ttl` more (its task got a later slot).
    fn keep_payload<'a>(&'a self, reference: &'a str, ttl: Millis) -> StoreFuture<'a, ()>;
    /// Takes the right to publish a task's message for `lease` (the dispatcher's once-only claim).
    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim>;
    /// Records the message as published (kept `memory`) and drops its claim-checked payload.
    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, memory: Millis) -> StoreFuture<'a, ()>;
    /// Lets a retry publish at once after this attempt failed.
    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Ping for RedisStore<C> {
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut self.connection()).await?;
            Ok(())
        })
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for RedisStore<C> {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(RedisStore::reserve(self, request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::complete(self, request, reserved))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::release(self, request, reserved))
    }

    fn correct_cost<'a>(&'a self, request: &'a SlotRequest<'a>, actual: u64) -> StoreFuture<'a, Correction> {
        Box::pin(RedisStore::correct_cost(self, request, actual))
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
        by: Author<'a>,
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

    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>> {
        Box::pin(RedisStore::list_overrides(self, RuleRef::of(rule)))
    }

    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<AuditEntry>> {
        Box::pin(RedisStore::audit_history(self, &rule.id, count))
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => {
                let classes = Calendar::Classes { rule: RuleRef::of(rule), key: scope, calendar };
                Box::pin(self.pause_calendar(classes, until, None))
            }
            None => Box::pin(RedisStore::pause(self, RuleRef::of(rule), key, until, None)),
        }
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        Box::pin(self.pause_calendar(Calendar::Budget(budget), until, None))
    }

    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => Box::pin(
                self.resume_calendar(Calendar::Classes { rule: RuleRef::of(rule), key: scope, calendar }, None),
            ),
            None => Box::pin(RedisStore::resume(self, RuleRef::of(rule), key, None)),
        }
    }

    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(self.resume_calendar(Calendar::Budget(budget), None))
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        Box::pin(async move {
            if let Some((calendar, scope)) = crate::inspect::class_calendar(rule, key) {
                let classes = Calendar::Classes { rule: RuleRef::of(rule), key: scope, calendar };
                return self.signal_calendar(classes, None).await;
            }
            let Some(adaptive) = &rule.adaptive else { return Ok(None) };
            RedisStore::signal(self, RuleRef::of(rule), key, (adaptive, &rule.limits), None).await.map(Some)
        })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        Box::pin(self.signal_calendar(Calendar::Budget(budget), None))
    }

    fn report_latency<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        Box::pin(async move {
            if let Some((calendar, scope)) = crate::inspect::class_calendar(rule, key) {
                let classes = Calendar::Classes { rule: RuleRef::of(rule), key: scope, calendar };
                return self.report_calendar_latency(classes, report, None).await;
            }
            let Some(adaptive) = &rule.adaptive else { return Ok(None) };
            RedisStore::report_latency(self, RuleRef::of(rule), key, (adaptive, &rule.limits), report, None).await
        })
    }

    fn report_budget_latency<'a>(
        &'a self,
        budget: &'a Budget,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        Box::pin(self.report_calendar_latency(Calendar::Budget(budget), report, None))
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(RedisStore::frontier(self, RuleRef::of(rule), key))
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(RedisStore::paused_until(self, rule, key))
    }

    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::record_audit(self, entry))
    }

    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(RedisStore::get_payload(self, reference))
    }

    fn keep_payload<'a>(&'a self, reference: &'a str, ttl: Millis) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::keep_payload(self, reference, ttl))
    }

    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim> {
        Box::pin(RedisStore::claim_dispatch(self, of, lease))
    }

    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, memory: Millis) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::finish_dispatch(self, of, memory))
    }

    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()> {
        Box::pin(RedisStore::release_dispatch(self, of))
    }
}

impl Ping for MemoryStore {
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

impl Store for MemoryStore {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(MemoryStore::reserve(self, request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(MemoryStore::complete(self, request, reserved))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(MemoryStore::release(self, request, reserved))
    }

    fn correct_cost<'a>(&'a self, request: &'a SlotRequest<'a>, actual: u64) -> StoreFuture<'a, Correction> {
        Box::pin(MemoryStore::correct_cost(self, request, actual))
    }

    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], _: Millis) -> StoreFuture<'a, String> {
        let reference = MemoryStore::put_payload(self, of, payload);
        Box::pin(async move { Ok(reference) })
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        let state = self.entity_state(&rule.id, key).unwrap_or_default();
        let calendar = crate::inspect::class_calendar(rule, key).map(|(calendar, scope)| {
            (calendar.clone(), self.budget_state(&calendar.state_name(Some(scope))).unwrap_or_default())
        });
        let shared = rule.budgets.iter().map(|b| (b.clone(), self.budget_state(&b.name).unwrap_or_default()));
        let budgets: Vec<_> = calendar.into_iter().chain(shared).collect();
        let scope = crate::inspect::class_calendar(rule, key).map_or(key, |(_, scope)| scope);
        let pools: Vec<_> = budgets
            .iter()
            .map(|(b, _)| {
                let partition = b.partition_of(scope).filter(|_| !b.per_key)?;
                Some((partition, self.budget_state(&b.pool_name(partition)).unwrap_or_default()))
            })
            .collect();
        let now = wall_clock_millis();
        let slots = self.reserved_slots(&rule.id, key, crate::inspect::slots_since(rule, now));
        Box::pin(async move { Ok(report(rule, key, now, &state, &budgets, &pools, &slots)) })
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: Author<'a>,
    ) -> StoreFuture<'a, OverrideChange> {
        let before = match set {
            Some(set) => self.set_override(&rule.id, key, limit, set),
            None => self.delete_override(&rule.id, key, limit),
        };
        let change = OverrideChange::new(wall_clock_millis(), by, (&rule.id, key, limit), before, set);
        self.record_override(&change);
        Box::pin(async move { Ok(change) })
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        let overrides = self.entity_state(&rule.id, key).map(|s| s.overrides).unwrap_or_default();
        Box::pin(async move { Ok(overrides) })
    }

    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>> {
        let all = MemoryStore::list_overrides(self, &rule.id);
        Box::pin(async move { Ok(all) })
    }

    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<AuditEntry>> {
        let entries = MemoryStore::audit_history(self, &rule.id, count);
        Box::pin(async move { Ok(entries) })
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => self.pause_budget(&MemoryStore::class_calendar(calendar, scope), until),
            None => self.pause(&rule.id, key, until),
        }
        Box::pin(async { Ok(()) })
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        self.pause_budget(budget, until);
        Box::pin(async { Ok(()) })
    }

    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let ended = match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => MemoryStore::resume_budget(self, &MemoryStore::class_calendar(calendar, scope)),
            None => MemoryStore::resume(self, &rule.id, key),
        };
        Box::pin(async move { Ok(ended) })
    }

    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>> {
        let ended = MemoryStore::resume_budget(self, budget);
        Box::pin(async move { Ok(ended) })
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        let now = wall_clock_millis();
        let level = match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => self.signal_budget(&MemoryStore::class_calendar(calendar, scope), now),
            None => rule.adaptive.map(|a| self.signal(&rule.id, key, (&a, &rule.limits), now)),
        };
        Box::pin(async move { Ok(level) })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        let level = self.signal_budget(budget, wall_clock_millis());
        Box::pin(async move { Ok(level) })
    }

    fn report_latency<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        let now = wall_clock_millis();
        let change = match crate::inspect::class_calendar(rule, key) {
            Some((calendar, scope)) => {
                self.report_budget_latency(&MemoryStore::class_calendar(calendar, scope), report, now)
            }
            None => rule.adaptive.and_then(|a| self.report_latency(&rule.id, key, (&a, &rule.limits), report, now)),
        };
        Box::pin(async move { Ok(change.map(LatencyChange::from)) })
    }

    fn report_budget_latency<'a>(
        &'a self,
        budget: &'a Budget,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        let change = self.report_budget_latency(budget, report, wall_clock_millis());
        Box::pin(async move { Ok(change.map(LatencyChange::from)) })
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let last = self.entity_state(&rule.id, key).and_then(|state| state.last_slot);
        Box::pin(async move { Ok(last) })
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let own = self.entity_state(&rule.id, key).and_then(|state| state.paused_until);
        let calendar = crate::inspect::class_calendar(rule, key)
            .and_then(|(calendar, scope)| self.budget_state(&calendar.state_name(Some(scope)))?.paused_until);
        let budgets = rule.budgets.iter().filter_map(|b| self.budget_state(&b.name).and_then(|s| s.paused_until));
        let budgets = calendar.into_iter().chain(budgets);
        let until = own.into_iter().chain(budgets).max();
        Box::pin(async move { Ok(until) })
    }

    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        MemoryStore::record_audit(self, entry);
        Box::pin(async { Ok(()) })
    }

    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        let payload = self.payload(reference);
        Box::pin(async move { Ok(payload) })
    }

    fn keep_payload<'a>(&'a self, _: &'a str, _: Millis) -> StoreFuture<'a, ()> {
        // The model's payloads never expire.
        Box::pin(async { Ok(()) })
    }

    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim> {
        let claim = MemoryStore::claim_dispatch(self, of, lease);
        Box::pin(async move { Ok(claim) })
    }

    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, _: Millis) -> StoreFuture<'a, ()> {
        MemoryStore::finish_dispatch(self, of);
        Box::pin(async { Ok(()) })
    }

    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()> {
        MemoryStore::release_dispatch(self, of);
        Box::pin(async { Ok(()) })
    }
}
