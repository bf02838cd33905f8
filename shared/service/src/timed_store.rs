//! A store that times every call into `drip_dependency_call_seconds{dependency="redis"}`, around
//! any other: the services wrap theirs once instead of timing each call site (as envoy
//! ratelimit's stats-collecting client wraps its Redis client).

use std::collections::BTreeMap;
use std::sync::Arc;

use drip_core::budgets::Budget;
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::LimitOverride;
use drip_core::time::Millis;
use drip_store::inspect::EntityReport;
use drip_store::{
    AuditEntry, DispatchClaim, MessageOf, OverrideChange, Ping, Reserved, SlotRequest, Store, StoreFuture,
};

use crate::metrics::Metrics;

/// `inner`, each call timed under `redis`.
#[derive(Debug)]
pub struct TimedStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl TimedStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self { inner, metrics })
    }

    fn timed<'a, T: 'a>(&'a self, call: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        Box::pin(self.metrics.time("redis", call))
    }
}

impl Ping for TimedStore {
    fn ping(&self) -> StoreFuture<'_, ()> {
        self.inner.ping()
    }
}

impl Store for TimedStore {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        self.timed(self.inner.reserve(request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        self.timed(self.inner.complete(request, reserved))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        self.timed(self.inner.release(request, reserved))
    }

    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], ttl: Millis) -> StoreFuture<'a, String> {
        self.timed(self.inner.put_payload(of, payload, ttl))
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        self.timed(self.inner.inspect(rule, key))
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: drip_store::Author<'a>,
    ) -> StoreFuture<'a, OverrideChange> {
        self.timed(self.inner.change_override(rule, key, limit, set, by))
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        self.timed(self.inner.overrides(rule, key))
    }

    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>> {
        self.timed(self.inner.list_overrides(rule))
    }

    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<drip_store::AuditEntry>> {
        self.timed(self.inner.audit_history(rule, count))
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        self.timed(self.inner.pause(rule, key, until))
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        self.timed(self.inner.pause_budget(budget, until))
    }

    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        self.timed(self.inner.resume(rule, key))
    }

    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>> {
        self.timed(self.inner.resume_budget(budget))
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        self.timed(self.inner.signal(rule, key))
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        self.timed(self.inner.signal_budget(budget))
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        self.timed(self.inner.frontier(rule, key))
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        self.timed(self.inner.paused_until(rule, key))
    }

    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        self.timed(self.inner.record_audit(entry))
    }

    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.timed(self.inner.get_payload(reference))
    }

    fn keep_payload<'a>(&'a self, reference: &'a str, ttl: Millis) -> StoreFuture<'a, ()> {
        self.timed(self.inner.keep_payload(reference, ttl))
    }

    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim> {
        self.timed(self.inner.claim_dispatch(of, lease))
    }

    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, memory: Millis) -> StoreFuture<'a, ()> {
        self.timed(self.inner.finish_dispatch(of, memory))
    }

    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()> {
        self.timed(self.inner.release_dispatch(of))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_call_is_timed_once() {
        let metrics = Arc::new(Metrics::default());
        let store = TimedStore::new(Arc::new(drip_store::MemoryStore::new()), metrics.clone());
        let of = MessageOf { rule: "r", key: "k", message: "m" };
        store.claim_dispatch(of, 1_000).await.unwrap();
        store.release_dispatch(of).await.unwrap();
        let text = metrics.render();
        assert!(text.contains(r#"drip_dependency_call_seconds_count{dependency="redis",result="ok"} 2"#), "{text}");
    }
}
