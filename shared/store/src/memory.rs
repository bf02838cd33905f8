use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use drip_core::budgets::{Adaptive, Budget, LatencyOutcome, LatencyReport};
use drip_core::rules::Limit;
use drip_core::schedule::{BudgetState, Correction, LimitOverride, ReserveRequest, Scheduler, override_id};
use drip_core::time::{Millis, wall_clock_millis};

use crate::{AuditEntry, DispatchClaim, FeedbackChange, MessageOf, OverrideChange, Reserved, SlotRequest, StoreError};

/// The reference model behind a lock, with claim-checked payloads, dispatch claims and the
/// audit list (override changes and feedback calls) in maps: one process, no persistence.
#[derive(Debug, Default)]
pub struct MemoryStore {
    scheduler: Mutex<Scheduler>,
    payloads: Mutex<HashMap<String, Vec<u8>>>,
    /// Oldest first.
    audit: Mutex<Vec<AuditEntry>>,
    /// By message: `None` once published, else the end of the publishing attempt's lease.
    dispatched: Mutex<HashMap<String, Option<Millis>>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn message_name(of: MessageOf<'_>) -> String {
    format!("memory:{}|{}|{}", of.rule, of.key, of.message)
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps a payload until its dispatch; returns its reference.
    pub fn put_payload(&self, of: MessageOf<'_>, payload: &[u8]) -> String {
        let reference = message_name(of);
        locked(&self.payloads).insert(reference.clone(), payload.to_vec());
        reference
    }

    /// A payload `put_payload` kept, by its reference.
    pub fn payload(&self, reference: &str) -> Option<Vec<u8>> {
        locked(&self.payloads).get(reference).cloned()
    }

    pub fn record_audit(&self, entry: &AuditEntry) {
        locked(&self.audit).push(entry.clone());
    }

    pub fn record_override(&self, change: &OverrideChange) {
        locked(&self.audit).push(AuditEntry::Override(change.clone()));
    }

    /// The feedback calls recorded, oldest first.
    pub fn feedback_history(&self) -> Vec<FeedbackChange> {
        let audit = locked(&self.audit);
        audit.iter().filter_map(|e| if let AuditEntry::Feedback(f) = e { Some(f.clone()) } else { None }).collect()
    }

    /// As `RedisStore::audit_history`: the rule's latest `count` entries, newest first.
    pub fn audit_history(&self, rule: &str, count: usize) -> Vec<AuditEntry> {
        let audit = locked(&self.audit);
        let of_rule = audit.iter().rev().filter(|e| e.rule() == rule);
        of_rule.take(count).cloned().collect()
    }

    /// As `RedisStore::list_overrides`: every key of the rule with overrides (the keys ever
    /// changed, as the Redis store's index holds them).
    pub fn list_overrides(&self, rule: &str) -> BTreeMap<String, BTreeMap<String, LimitOverride>> {
        let keys: std::collections::BTreeSet<String> = locked(&self.audit)
            .iter()
            .filter_map(|e| match e {
                AuditEntry::Override(change) if change.rule == rule => Some(change.key.clone()),
                _ => None,
            })
            .collect();
        let each = keys.into_iter().filter_map(|key| {
            let overrides = self.entity_state(rule, &key)?.overrides;
            (!overrides.is_empty()).then_some((key, overrides))
        });
        each.collect()
    }

    /// As `RedisStore::claim_dispatch` (dispatch.lua), on the wall clock.
    pub fn claim_dispatch(&self, of: MessageOf<'_>, lease: Millis) -> DispatchClaim {
        let now = wall_clock_millis();
        let mut dispatched = locked(&self.dispatched);
        match dispatched.get(&message_name(of)) {
            Some(None) => DispatchClaim::Done,
            Some(Some(until)) if *until > now => DispatchClaim::Busy,
            _ => {
                dispatched.insert(message_name(of), Some(now + lease));
                DispatchClaim::Acquired
            }
        }
    }

    pub fn finish_dispatch(&self, of: MessageOf<'_>) {
        locked(&self.dispatched).insert(message_name(of), None);
        locked(&self.payloads).remove(&message_name(of));
    }

    pub fn release_dispatch(&self, of: MessageOf<'_>) {
        let mut dispatched = locked(&self.dispatched);
        if dispatched.get(&message_name(of)).is_some_and(Option::is_some) {
            dispatched.remove(&message_name(of));
        }
    }

    pub async fn reserve(&self, request: &SlotRequest<'_>) -> Result<Reserved, StoreError> {
        let now = request.now().unwrap_or_else(wall_clock_millis);
        let model_request = ReserveRequest { now, ..request.event };
        let reservation = self.with(|s| match request.reslot {
            Some(old) => s.reslot(request.rule, request.key, &model_request, old),
            None => s.reserve(request.rule, request.key, &model_request),
        });
        Ok(Reserved { reservation, now })
    }

    pub async fn correct_cost(&self, request: &SlotRequest<'_>, actual: u64) -> Result<Correction, StoreError> {
        let now = request.now().unwrap_or_else(wall_clock_millis);
        let model_request = ReserveRequest { now, ..request.event };
        Ok(self.with(|s| s.correct(request.rule, request.key, &model_request, actual)))
    }

    pub async fn complete(&self, request: &SlotRequest<'_>, _: &Reserved) -> Result<(), StoreError> {
        self.with(|s| s.complete(request.rule, request.key, (request.event.message_id, request.event.published)));
        Ok(())
    }

    pub async fn release(&self, request: &SlotRequest<'_>, _: &Reserved) -> Result<(), StoreError> {
        self.with(|s| s.release(request.rule, request.key, (request.event.message_id, request.event.published)));
        Ok(())
    }
}

impl MemoryStore {
    /// The model's state of one entity (what `RedisStore::entity_state` reads back from Redis).
    pub fn entity_state(&self, rule: &str, key: &str) -> Option<drip_core::schedule::EntityState> {
        self.with(|s| s.entity_state(rule, key).cloned())
    }

    /// As `RedisStore::reserved_slots`, on the model.
    pub fn reserved_slots(&self, rule: &str, key: &str, since: Millis) -> Vec<Millis> {
        self.with(|s| s.reserved_slots(rule, key, since))
    }

    /// As `RedisStore::set_override`, on the model.
    pub fn set_override(&self, rule: &str, key: &str, limit: &Limit, set: LimitOverride) -> Option<LimitOverride> {
        self.with(|s| s.set_override(rule, key, &override_id(limit), set))
    }

    pub fn delete_override(&self, rule: &str, key: &str, limit: &Limit) -> Option<LimitOverride> {
        self.with(|s| s.delete_override(rule, key, &override_id(limit)))
    }

    /// As `RedisStore::pause`, on the model.
    pub fn pause(&self, rule: &str, key: &str, until: drip_core::time::Millis) {
        self.with(|s| s.pause(rule, key, until));
    }

    /// As `RedisStore::pause_budget`, on the model.
    pub fn pause_budget(&self, budget: &Budget, until: drip_core::time::Millis) {
        self.with(|s| s.pause_budget(&budget.name, until));
    }

    /// The calendar of `key` of a rule with classes, as the model keeps it: a budget named
    /// `Budget::state_name`.
    pub fn class_calendar(calendar: &Budget, key: &str) -> Budget {
        Budget { name: calendar.state_name(Some(key)), per_key: false, ..calendar.clone() }
    }

    /// As `RedisStore::resume`, on the model.
    pub fn resume(&self, rule: &str, key: &str) -> Option<Millis> {
        self.with(|s| s.resume(rule, key))
    }

    /// As `RedisStore::resume_budget`, on the model.
    pub fn resume_budget(&self, budget: &Budget) -> Option<Millis> {
        self.with(|s| s.resume_budget(&budget.name))
    }

    /// As `RedisStore::signal`, on the model: the entity's adaptive limit saw a 429, 5xx or timeout.
    /// Returns the level after it (ppm).
    pub fn signal(&self, rule: &str, key: &str, (adaptive, limits): (&Adaptive, &[Limit]), now: Millis) -> u64 {
        self.with(|s| s.signal(rule, key, adaptive, limits, now))
    }

    /// As `RedisStore::signal_budget`, on the model.
    pub fn signal_budget(&self, budget: &Budget, now: Millis) -> Option<u64> {
        self.with(|s| s.signal_budget(budget, now))
    }

    /// As `RedisStore::report_latency`, on the model.
    pub fn report_latency(
        &self,
        rule: &str,
        key: &str,
        adaptive_limits: (&Adaptive, &[Limit]),
        report: LatencyReport,
        now: Millis,
    ) -> Option<LatencyOutcome> {
        self.with(|s| s.report_latency((rule, key), adaptive_limits, report, now))
    }

    /// As `RedisStore::report_budget_latency`, on the model.
    pub fn report_budget_latency(&self, budget: &Budget, report: LatencyReport, now: Millis) -> Option<LatencyOutcome> {
        self.with(|s| s.report_budget_latency(budget, report, now))
    }

    /// The model's state of one budget.
    pub fn budget_state(&self, budget: &str) -> Option<BudgetState> {
        self.with(|s| s.budget_state(budget).cloned())
    }

    fn with<T>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        f(&mut locked(&self.scheduler))
    }
}
