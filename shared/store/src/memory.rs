use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use drip_core::budgets::{Budget, FairRing, LatencyChange, LatencyReport};
use drip_core::fair::{Member, Ring};
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::{
    AnswerFile, BudgetState, Correction, LimitOverride, ReserveRequest, Scheduler, Unpark, override_id,
};
use drip_core::time::{Millis, wall_clock_millis};

use crate::busiest::BusyKeys;
use crate::inspect::{EntityReport, class_calendar, report};
use crate::overrides::Author;
use crate::store::{Ping, Store};
use crate::{
    keys::RuleRef, overrides::AuditEntry, overrides::FeedbackChange, overrides::OverrideChange,
    redis_store::DispatchClaim, redis_store::MessageOf, request::Clock, request::ParkedBody, request::Reserved,
    request::SlotRequest, request::StoreFuture,
};

/// The reference model behind a lock, with claim-checked payloads, dispatch claims and the
/// audit list (override changes and feedback calls) in maps: one process, no persistence.
#[derive(Debug, Default)]
pub struct MemoryStore {
    scheduler: Mutex<Scheduler>,
    payloads: Mutex<HashMap<String, Vec<u8>>>,
    /// Parked messages' bodies (by `parked_name`), kept in their queue's entry or beside it.
    parked: Mutex<HashMap<String, ParkedBody>>,
    /// Oldest first.
    audit: Mutex<Vec<AuditEntry>>,
    /// By message: `None` once published, else the end of the publishing attempt's lease.
    dispatched: Mutex<HashMap<String, Option<Millis>>>,
    /// Drained messages not handed over yet: (rule, key, answer file), in order.
    handing: Mutex<Vec<(String, String, AnswerFile)>>,
    clock: Clock,
    /// Each rule's refusals by minute (`Store::count_answer`); never expire in the model.
    answers: Mutex<BTreeMap<(String, Millis), BTreeMap<u16, u64>>>,
    /// Every name's `shared_secret`: one process holds the model, so any value serves (zeros).
    secret: [u8; 32],
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where the model keeps a parked message's body.
fn parked_name(rule: &str, key: &str, (minute, id): &AnswerFile) -> String {
    format!("memory-parked:{rule}|{key}|{minute:?}|{id}")
}

fn file_of(request: &SlotRequest<'_>) -> AnswerFile {
    let minute = request.event.published.map(|at| at.div_euclid(drip_core::schedule::ANSWER_MINUTE));
    (minute, request.event.message_id.to_owned())
}

fn message_name(of: MessageOf<'_>) -> String {
    format!("memory:{}|{}|{}", of.rule, of.key, of.message)
}

/// An answer the model has at once.
fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(async move { Ok(value) })
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock overrides, pauses, signals and latency reports are decided at: the wall clock
    /// until a test or the simulator sets it; a reservation keeps its own (`SlotRequest::at`).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    fn now(&self) -> Millis {
        self.clock.now().unwrap_or_else(wall_clock_millis)
    }

    /// The feedback calls recorded, oldest first.
    pub fn feedback_history(&self) -> Vec<FeedbackChange> {
        let audit = locked(&self.audit);
        audit.iter().filter_map(|e| if let AuditEntry::Feedback(f) = e { Some(f.clone()) } else { None }).collect()
    }

    /// The model's state of one entity (what `RedisStore::entity_state` reads back from Redis).
    pub fn entity_state(&self, rule: &str, key: &str) -> Option<drip_core::schedule::EntityState> {
        self.with(|s| s.entity_state(rule, key).cloned())
    }

    /// As `RedisStore::reserved_slots`, on the model.
    pub fn reserved_slots(&self, rule: &str, key: &str, since: Millis) -> Vec<Millis> {
        self.with(|s| s.reserved_slots(rule, key, since))
    }

    /// The model's state of one budget (by `Budget::state_name` for a classed key's calendar, or
    /// `Budget::pool_name` for a leased budget's pool).
    pub fn budget_state(&self, budget: &str) -> Option<BudgetState> {
        self.with(|s| s.budget_state(budget).cloned())
    }

    /// The calendar of a classed key (`class_calendar`'s scope) as the model keeps it: a budget
    /// named `Budget::state_name`; else the entity itself (`None`).
    fn calendar_of(rule: &Rule, key: &str) -> Option<Budget> {
        class_calendar(rule, key).map(|(calendar, scope)| Budget {
            name: calendar.state_name(Some(scope)),
            per_key: false,
            fair: None,
            ..(**calendar).clone()
        })
    }

    /// Where a rule with classes keeps `key`'s overrides (`key` or any `<key>#<class>`): its
    /// calendar's state name. `None`: the entity's own state.
    fn overrides_calendar(rule: &Rule, key: &str) -> Option<String> {
        let calendar = &rule.classes.as_ref()?.calendar;
        Some(calendar.state_name(Some(RuleRef::of(rule).scope(key))))
    }

    fn overrides_of(&self, rule: &Rule, key: &str) -> BTreeMap<String, LimitOverride> {
        let held = match Self::overrides_calendar(rule, key) {
            Some(calendar) => self.budget_state(&calendar).map(|s| s.overrides),
            None => self.entity_state(&rule.id, key).map(|s| s.overrides),
        };
        held.unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        f(&mut locked(&self.scheduler))
    }
}

impl Ping for MemoryStore {
    fn ping(&self) -> StoreFuture<'_, ()> {
        ready(())
    }
}

impl MemoryStore {
    /// Reserves each request in order as one call of the Redis store would: each event's lease,
    /// if it asks for one, also asks for the events behind it in the call from the same pool.
    pub fn reserve_batch(&self, requests: &[SlotRequest<'_>]) -> Vec<Reserved> {
        let with_queued = requests.iter().zip(queued_behind(requests));
        with_queued
            .map(|(request, queued)| {
                let event = ReserveRequest { queued: &queued, ..request.event };
                self.reserve_now(&SlotRequest { event, ..*request })
            })
            .collect()
    }

    fn reserve_now(&self, request: &SlotRequest<'_>) -> Reserved {
        let now = request.now().unwrap_or_else(wall_clock_millis);
        let model_request = ReserveRequest { now, ..request.event };
        let (reservation, armed) = self.with(|s| {
            let reservation = match request.reslot {
                Some(old) => s.reslot(request.rule, request.key, &model_request, old),
                None => s.reserve(request.rule, request.key, &model_request),
            };
            (reservation, s.take_armed().is_some())
        });
        let reserved = Reserved { reservation, now, armed };
        if let Some(body) = request.parked_body.filter(|_| reserved.body_kept(request)) {
            self.keep_body(request, body, true);
        }
        reserved
    }

    fn keep_body(&self, request: &SlotRequest<'_>, body: &[u8], in_entry: bool) {
        let name = parked_name(request.rule, request.key, &file_of(request));
        locked(&self.parked).insert(name, ParkedBody { body: body.to_vec(), in_entry });
    }
}

impl Store for MemoryStore {
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        ready(self.reserve_now(request))
    }

    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, _: &'a Reserved) -> StoreFuture<'a, ()> {
        self.with(|s| s.complete(request.rule, request.key, (request.event.message_id, request.event.published)));
        ready(())
    }

    fn unpark<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, (Unpark, Millis)> {
        let now = request.now().unwrap_or_else(wall_clock_millis);
        let deadline = request.unpark.unwrap_or(now);
        let model_request = ReserveRequest { now, ..request.event };
        let unpark = self.with(|s| s.unpark(request.rule, request.key, &model_request, deadline));
        if let Unpark::Decided(_) = unpark {
            locked(&self.handing).push((request.rule.to_owned(), request.key.to_owned(), file_of(request)));
        }
        ready((unpark, now))
    }

    fn fair_ring<'a>(&'a self, ring: FairRing<'a>) -> StoreFuture<'a, Ring> {
        ready(self.with(|s| s.fair_ring(&ring.name())))
    }

    fn fair_leave<'a>(
        &'a self,
        ring: FairRing<'a>,
        rule: Option<&'a Rule>,
        member: &'a Member,
    ) -> StoreFuture<'a, bool> {
        ready(self.with(|s| s.fair_leave(&ring.name(), member, rule.is_none())))
    }

    fn fair_turned<'a>(
        &'a self,
        ring: FairRing<'a>,
        cursor: u64,
        wake: Option<Millis>,
    ) -> StoreFuture<'a, Option<Millis>> {
        let now = self.now();
        ready(self.with(|s| s.fair_turned(&ring.name(), now, cursor, wake)))
    }

    /// Each unpark in order, as one call of the Redis store would make them: a drain's head that
    /// asks for a lease also asks for the heads behind it in the call from the same pool.
    fn unpark_all<'a>(&'a self, requests: &'a [SlotRequest<'a>]) -> StoreFuture<'a, Vec<(Unpark, Millis)>> {
        Box::pin(async move {
            let now = requests.first().and_then(SlotRequest::now).unwrap_or_else(wall_clock_millis);
            let mut unparked = Vec::with_capacity(requests.len());
            for (request, queued) in requests.iter().zip(queued_behind(requests)) {
                let request = (*request).at(now);
                let event = ReserveRequest { queued: &queued, ..request.event };
                unparked.push(self.unpark(&SlotRequest { event, ..request }).await?);
            }
            Ok(unparked)
        })
    }

    /// The model's bodies never expire.
    fn park_body<'a>(&'a self, request: &'a SlotRequest<'a>, body: &'a [u8], _: Millis) -> StoreFuture<'a, ()> {
        self.keep_body(request, body, false);
        ready(())
    }

    fn parked_bodies<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Option<ParkedBody>>> {
        let parked = self.with(|s| s.parked(&rule.id, key));
        let bodies = locked(&self.parked);
        let bodies = parked.iter().take(count).map(|file| bodies.get(&parked_name(&rule.id, key, file)).cloned());
        ready(bodies.collect())
    }

    fn handing<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Vec<Option<ParkedBody>>> {
        let handing = locked(&self.handing);
        let parked = locked(&self.parked);
        let bodies = handing
            .iter()
            .filter(|(r, k, _)| *r == rule.id && k == key)
            .map(|(r, k, file)| parked.get(&parked_name(r, k, file)).cloned());
        ready(bodies.collect())
    }

    fn handed_over<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, ()> {
        let file = file_of(request);
        let mut handing = locked(&self.handing);
        if let Some(at) = handing.iter().position(|(r, k, f)| r == request.rule && k == request.key && *f == file) {
            handing.remove(at);
        }
        locked(&self.parked).remove(&parked_name(request.rule, request.key, &file));
        ready(())
    }

    fn arm_wake<'a>(&'a self, rule: &'a Rule, key: &'a str, wanted: Millis) -> StoreFuture<'a, Option<Millis>> {
        let now = self.now();
        ready(self.with(|s| s.arm_wake(&rule.id, key, now, wanted)))
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, _: &'a Reserved) -> StoreFuture<'a, ()> {
        self.with(|s| s.release(request.rule, request.key, (request.event.message_id, request.event.published)));
        ready(())
    }

    fn correct_cost<'a>(&'a self, request: &'a SlotRequest<'a>, actual: u64) -> StoreFuture<'a, Correction> {
        let now = request.now().unwrap_or_else(wall_clock_millis);
        let model_request = ReserveRequest { now, ..request.event };
        ready(self.with(|s| s.correct(request.rule, request.key, &model_request, actual)))
    }

    /// The model's payloads never expire.
    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], _: Millis) -> StoreFuture<'a, String> {
        let reference = message_name(of);
        locked(&self.payloads).insert(reference.clone(), payload.to_vec());
        ready(reference)
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        let state = self.entity_state(&rule.id, key).unwrap_or_default();
        let classes = class_calendar(rule, key);
        let calendar = classes.map(|(calendar, scope)| {
            (calendar.clone(), self.budget_state(&calendar.state_name(Some(scope))).unwrap_or_default())
        });
        let shared = rule.budgets.iter().map(|b| (b.clone(), self.budget_state(&b.name).unwrap_or_default()));
        let budgets: Vec<_> = calendar.into_iter().chain(shared).collect();
        let scope = classes.map_or(key, |(_, scope)| scope);
        let pools: Vec<_> = budgets
            .iter()
            .map(|(b, _)| {
                let partition = b.partition_of(scope).filter(|_| !b.per_key)?;
                Some((partition, self.budget_state(&b.pool_name(partition)).unwrap_or_default()))
            })
            .collect();
        let now = self.now();
        let slots = self.reserved_slots(&rule.id, key, crate::inspect::slots_since(rule, now));
        let mut report = report(rule, key, now, &state, &budgets, &pools, &slots);
        if let Some(budget) = rule.fair_budget() {
            let waiting: Vec<(Member, u64)> = self.with(|s| {
                let ring = s.fair_ring(&FairRing::of_key(budget, scope).name()).members;
                ring.into_iter().map(|m| (m.clone(), s.entity_state(&m.rule, &m.key).map_or(0, |e| e.parked))).collect()
            });
            if let Some(shown) = report.budgets.iter_mut().find(|b| b.name == budget.name) {
                shown.fair = crate::inspect::fair_report(budget, &waiting, (&rule.id, key), |k| rule.scope_of(k));
            }
        }
        ready(report)
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: Author<'a>,
    ) -> StoreFuture<'a, OverrideChange> {
        let id = override_id(limit);
        let key = RuleRef::of(rule).scope(key);
        let before = self.with(|s| match (Self::overrides_calendar(rule, key), set) {
            (Some(calendar), set) => s.change_calendar_override(&calendar, &id, set),
            (None, Some(set)) => s.set_override(&rule.id, key, &id, set),
            (None, None) => s.delete_override(&rule.id, key, &id),
        });
        let change = OverrideChange::new(self.now(), by, (&rule.id, key, limit), before, set);
        locked(&self.audit).push(AuditEntry::Override(change.clone()));
        ready(change)
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        ready(self.overrides_of(rule, key))
    }

    /// Every key of the rule ever changed (as the Redis store's index holds them) that has
    /// overrides now.
    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>> {
        let keys: std::collections::BTreeSet<String> = locked(&self.audit)
            .iter()
            .filter_map(|e| match e {
                AuditEntry::Override(change) if change.rule == rule.id => Some(change.key.clone()),
                _ => None,
            })
            .collect();
        let each = keys.into_iter().filter_map(|key| {
            let overrides = self.overrides_of(rule, &key);
            (!overrides.is_empty()).then_some((key, overrides))
        });
        ready(each.collect())
    }

    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<AuditEntry>> {
        let audit = locked(&self.audit);
        let of_rule = audit.iter().rev().filter(|e| e.rule() == rule.id);
        ready(of_rule.take(count).cloned().collect())
    }

    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        match Self::calendar_of(rule, key) {
            Some(calendar) => self.with(|s| s.pause_budget(&calendar.name, until)),
            None => self.with(|s| s.pause(&rule.id, key, until)),
        }
        ready(())
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        self.with(|s| s.pause_budget(&budget.name, until));
        ready(())
    }

    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        ready(match Self::calendar_of(rule, key) {
            Some(calendar) => self.with(|s| s.resume_budget(&calendar.name)),
            None => self.with(|s| s.resume(&rule.id, key)),
        })
    }

    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>> {
        ready(self.with(|s| s.resume_budget(&budget.name)))
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        let now = self.now();
        ready(match Self::calendar_of(rule, key) {
            Some(calendar) => self.with(|s| s.signal_budget(&calendar, now)),
            None => rule.adaptive.map(|a| self.with(|s| s.signal(&rule.id, key, &a, &rule.limits, now))),
        })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        let now = self.now();
        ready(self.with(|s| s.signal_budget(budget, now)))
    }

    fn report_latency<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        let now = self.now();
        let change = match Self::calendar_of(rule, key) {
            Some(calendar) => self.with(|s| s.report_budget_latency(&calendar, report, now)),
            None => rule
                .adaptive
                .and_then(|a| self.with(|s| s.report_latency((&rule.id, key), (&a, &rule.limits), report, now))),
        };
        ready(change.map(LatencyChange::from))
    }

    fn report_budget_latency<'a>(
        &'a self,
        budget: &'a Budget,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        let now = self.now();
        ready(self.with(|s| s.report_budget_latency(budget, report, now)).map(LatencyChange::from))
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        ready(self.entity_state(&rule.id, key).and_then(|state| state.last_slot))
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        let own = self.entity_state(&rule.id, key).and_then(|state| state.paused_until);
        let calendar = class_calendar(rule, key)
            .and_then(|(calendar, scope)| self.budget_state(&calendar.state_name(Some(scope)))?.paused_until);
        let budgets = rule.budgets.iter().filter_map(|b| self.budget_state(&b.name).and_then(|s| s.paused_until));
        let budgets = calendar.into_iter().chain(budgets);
        ready(own.into_iter().chain(budgets).max())
    }

    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        locked(&self.audit).push(entry.clone());
        ready(())
    }

    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        ready(locked(&self.payloads).get(reference).cloned())
    }

    /// The model's payloads never expire.
    fn keep_payload<'a>(&'a self, _: &'a str, _: Millis) -> StoreFuture<'a, ()> {
        ready(())
    }

    /// As dispatch.lua, on the store's clock.
    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim> {
        let now = self.now();
        let mut dispatched = locked(&self.dispatched);
        let claim = match dispatched.get(&message_name(of)) {
            Some(None) => DispatchClaim::Done,
            Some(Some(until)) if *until > now => DispatchClaim::Busy,
            _ => {
                dispatched.insert(message_name(of), Some(now + lease));
                DispatchClaim::Acquired
            }
        };
        ready(claim)
    }

    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, _: Millis) -> StoreFuture<'a, ()> {
        locked(&self.dispatched).insert(message_name(of), None);
        locked(&self.payloads).remove(&message_name(of));
        ready(())
    }

    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()> {
        let mut dispatched = locked(&self.dispatched);
        if dispatched.get(&message_name(of)).is_some_and(Option::is_some) {
            dispatched.remove(&message_name(of));
        }
        ready(())
    }

    /// Every entity the model holds is examined: `examine` bounds only Redis's search.
    fn busiest_keys<'a>(&'a self, rule: &'a Rule, count: usize, _: usize) -> StoreFuture<'a, BusyKeys> {
        let found = self.with(|s| {
            let of_rule = s.entities_of(&rule.id).filter_map(|(key, last)| Some((key.to_owned(), last?)));
            let scoped = of_rule.map(|(key, last)| (rule.scope_of(&key).to_owned(), last));
            scoped.collect::<Vec<_>>()
        });
        ready(BusyKeys::ranked(found, count, true))
    }

    fn slots_since<'a>(&'a self, rule: &'a Rule, key: &'a str, since: Millis) -> StoreFuture<'a, Vec<Millis>> {
        ready(self.reserved_slots(&rule.id, key, since))
    }

    fn count_answer<'a>(&'a self, rule: &'a Rule, status: u16) -> StoreFuture<'a, ()> {
        let minute = self.now().div_euclid(drip_core::time::MINUTE);
        *locked(&self.answers).entry((rule.id.clone(), minute)).or_default().entry(status).or_default() += 1;
        ready(())
    }

    fn answers_since<'a>(&'a self, rule: &'a Rule, since: Millis) -> StoreFuture<'a, BTreeMap<u16, u64>> {
        let (first, last) = (since.div_euclid(drip_core::time::MINUTE), self.now().div_euclid(drip_core::time::MINUTE));
        let answers = locked(&self.answers);
        let minutes =
            answers.range((rule.id.clone(), first)..=(rule.id.clone(), last)).map(|(_, counts)| counts.clone());
        ready(crate::answers::sum(minutes))
    }

    fn shared_secret<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Vec<u8>> {
        ready(self.secret.to_vec())
    }
}

/// For each request, the cost of the requests after it in one call by leased pool it draws from
/// (what its lease, if it asks for one, asks for beside its own cost).
fn queued_behind(requests: &[SlotRequest<'_>]) -> Vec<Vec<(String, u64)>> {
    let mut behind: HashMap<String, u64> = HashMap::new();
    let mut queued: Vec<Vec<(String, u64)>> = Vec::with_capacity(requests.len());
    for request in requests.iter().rev() {
        let pools: Vec<String> = request.event.leased_pools(request.key).collect();
        queued.push(pools.iter().map(|pool| (pool.clone(), behind.get(pool).copied().unwrap_or(0))).collect());
        for pool in pools {
            *behind.entry(pool).or_default() += request.event.cost;
        }
    }
    queued.reverse();
    queued
}
