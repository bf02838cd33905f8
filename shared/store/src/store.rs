//! What the services need of a store, as one object-safe trait, implemented by Redis
//! (`RedisStore`, in redis_store.rs) and by the reference model (`MemoryStore`, in memory.rs), so
//! both services' handlers run over Redis in production and over the model in tests that need no
//! services. The trait is the stores' only API for these operations: a new one is a signature here
//! and a body in each of those two files. Operations that carry no time of their own decide at the
//! store's clock (`Clock`: Redis `TIME` or the wall clock, or a time a test sets).

use std::collections::BTreeMap;

use drip_core::budgets::{Budget, FairRing, LatencyChange, LatencyReport};
use drip_core::fair::{Member, Ring};
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::{Correction, LimitOverride, Unpark};
use drip_core::time::Millis;

use drip_core::rules::Classes;

use crate::busiest::BusyKeys;
use crate::inspect::{ClassReport, EntityReport};
use crate::overrides::Author;
use crate::{
    overrides::AuditEntry, overrides::OverrideChange, redis_store::DispatchClaim, redis_store::MessageOf,
    request::ParkedBody, request::Reserved, request::SlotRequest, request::StoreError, request::StoreFuture,
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
    /// The drain of the key's parked messages at the request's message (`request.unpark` holds
    /// the deadline): `Scheduler::unpark`, and the time it was decided at.
    fn unpark<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, (Unpark, Millis)>;
    /// Unparks each request in order, in one script call where the store has calls (a fair
    /// budget's drain hands a pass of its round over at once): what [`Store::unpark`] gives each,
    /// one after another. The requests share the first one's `now`.
    fn unpark_all<'a>(&'a self, requests: &'a [SlotRequest<'a>]) -> StoreFuture<'a, Vec<(Unpark, Millis)>>;
    /// Arms the wake of the key's drain at `wanted` unless one is armed (`Scheduler::arm_wake`):
    /// the wake to make a task for, if any.
    fn arm_wake<'a>(&'a self, rule: &'a Rule, key: &'a str, wanted: Millis) -> StoreFuture<'a, Option<Millis>>;
    /// A fair budget's ring (the budget's, or a partition's): its waiting keys, oldest first, and
    /// where its next drain starts.
    fn fair_ring<'a>(&'a self, ring: FairRing<'a>) -> StoreFuture<'a, Ring>;
    /// The member (a key of `rule`) leaves the ring unless messages of it parked since; with
    /// `None` (its rule is gone, or its own drain has its queue now) it leaves whatever is parked:
    /// whether it left.
    fn fair_leave<'a>(
        &'a self,
        ring: FairRing<'a>,
        rule: Option<&'a Rule>,
        member: &'a Member,
    ) -> StoreFuture<'a, bool>;
    /// A drain of the ring ended: where the next starts, and its wake (`Scheduler::fair_turned`):
    /// the wake to make a task for.
    fn fair_turned<'a>(
        &'a self,
        ring: FairRing<'a>,
        cursor: u64,
        wake: Option<Millis>,
    ) -> StoreFuture<'a, Option<Millis>>;
    /// Keeps the body of the request's parked message (its task body, as it would be made) for
    /// `ttl`: the key's drain makes its task from it.
    fn park_body<'a>(&'a self, request: &'a SlotRequest<'a>, body: &'a [u8], ttl: Millis) -> StoreFuture<'a, ()>;
    /// The bodies of the key's first `count` parked messages, oldest first (`None`: a message
    /// parked whose body is not kept yet, or any more).
    fn parked_bodies<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Option<ParkedBody>>>;
    /// The bodies of the messages a drain took from the key's queue and has not handed over.
    fn handing<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Vec<Option<ParkedBody>>>;
    /// The drained message is handed over (its task exists, or it is dead-lettered): it leaves
    /// the handing list and its body is dropped. `request.parked_body` is its body when the
    /// message's entry keeps it ([`ParkedBody::in_entry`]), else `None`.
    fn handed_over<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, ()>;
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
    /// No slot of the entity before `until` (the downstream said to wait, or an operator paused it).
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
    /// Up to `count` keys of the rule, the latest last slot first, from at most `examine` of
    /// its entities (the console's busiest keys).
    fn busiest_keys<'a>(&'a self, rule: &'a Rule, count: usize, examine: usize) -> StoreFuture<'a, BusyKeys>;
    /// The slots the entity's events hold from `since` on (exact, from their answers): its
    /// recent decisions, for the console.
    fn slots_since<'a>(&'a self, rule: &'a Rule, key: &'a str, since: Millis) -> StoreFuture<'a, Vec<Millis>>;
    /// Counts one refusal of the rule's downstream (a status, 0 for a timeout) in its minute, kept
    /// [`ANSWERS_KEPT`](crate::answers::ANSWERS_KEPT).
    fn count_answer<'a>(&'a self, rule: &'a Rule, status: u16) -> StoreFuture<'a, ()>;
    /// The rule's counted refusals from `since` on, by status.
    fn answers_since<'a>(&'a self, rule: &'a Rule, since: Millis) -> StoreFuture<'a, BTreeMap<u16, u64>>;
    /// A random secret named `name`, made by the first instance that asks and the same for every
    /// instance after (the console signs its forms' tokens with one).
    fn shared_secret<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Vec<u8>>;
}

/// What a store says of `key`: the entity's report, or for a rule with classes asked about a key
/// (not one class of it), its classes together ([`key_of_classes`]).
pub async fn inspect_key<S: Store + ?Sized>(store: &S, rule: &Rule, key: &str) -> Result<EntityReport, StoreError> {
    let classes = class_entities(rule, key);
    if classes.is_empty() {
        return store.inspect(rule, key).await;
    }
    let mut reports = Vec::with_capacity(classes.len());
    for (class, entity) in classes {
        reports.push((class, store.inspect(rule, &entity).await?));
    }
    Ok(key_of_classes(key, reports).expect("a rule with classes has at least one"))
}

/// How many of the rule's latest audit entries [`with_provenance`] looks through.
const PROVENANCE_DEPTH: usize = 200;

/// `report` with each override's provenance (`OverrideReport::set`), from the newest change of
/// that key's limit in the rule's audit list: what `drip inspect` and `GET .../keys/{key}` show.
pub async fn with_provenance<S: Store + ?Sized>(
    store: &S,
    rule: &Rule,
    mut report: EntityReport,
) -> Result<EntityReport, StoreError> {
    if report.overrides.is_empty() {
        return Ok(report);
    }
    let history = store.audit_history(rule, PROVENANCE_DEPTH).await?;
    for o in &mut report.overrides {
        let newest = history.iter().find_map(|entry| match entry {
            AuditEntry::Override(change) if change.key == report.key && change.limit == o.limit => Some(change),
            _ => None,
        });
        o.set = newest.map(|change| {
            let at = drip_core::time::format_rfc3339(change.at);
            match change.reason.as_deref() {
                Some(reason) if change.by == LEARNED_BY => format!("{reason} at {at}"),
                _ => format!("set by {} at {at}", change.by),
            }
        });
    }
    Ok(report)
}

/// Who a limit learned from the partner's answers is set by in the audit list (drip-service's
/// `learn`).
pub const LEARNED_BY: &str = "partner-headers";

/// The classes of `key` whose entities to read for a report of the whole key: each class's
/// `<key>#<class>`, when the rule has classes and `key` names no class of it.
fn class_entities(rule: &Rule, key: &str) -> Vec<(String, String)> {
    let Some(classes) = &rule.classes else { return Vec::new() };
    if classes.class_entity(key).is_some() {
        return Vec::new();
    }
    classes.names.iter().map(|class| (class.clone(), Classes::entity(key, class))).collect()
}

/// The report of a whole key of a rule with classes, from its classes' reports (`class_entities`
/// order): the key's calendar and budgets, each class's backlog, the total backlog and the last
/// drain.
fn key_of_classes(key: &str, reports: Vec<(String, EntityReport)>) -> Option<EntityReport> {
    let classes: Vec<ClassReport> = reports
        .iter()
        .map(|(class, r)| ClassReport {
            class: class.clone(),
            backlog: r.backlog,
            last_slot: r.last_slot.clone(),
            drains_at: r.drains_at.clone(),
        })
        .collect();
    let backlog = classes.iter().map(|c| c.backlog).sum();
    let drains_at = classes.iter().filter_map(|c| c.drains_at.clone()).max();
    let last_slot = classes.iter().filter_map(|c| c.last_slot.clone()).max();
    let (_, first) = reports.into_iter().next()?;
    Some(EntityReport { key: key.to_owned(), backlog, drains_at, last_slot, classes, ..first })
}
