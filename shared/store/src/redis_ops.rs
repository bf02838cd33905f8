//! The `Store` trait's operations on Redis: one body each, built from the helpers of
//! redis_store.rs (reservations, dispatch markers), overrides.rs (override.lua and the audit list),
//! budgets.rs (budget.lua on a calendar) and inspect.rs (reading state back).

use std::collections::BTreeMap;

use drip_core::budgets::{Budget, FairRing, LatencyChange, LatencyReport};
use drip_core::fair::{Member, Ring};
use drip_core::rules::{Limit, Rule};
use drip_core::schedule::{Correction, LimitOverride, Unpark};
use drip_core::time::Millis;
use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use crate::args::{EncodedEvent, ReserveArgs, answers_keep};
use crate::busiest::BusyKeys;
use crate::inspect::EntityReport;
use crate::keys::{DISPATCHED_MEMORY, EntryBody, fair_keys, field, member_of, payload_key, ring_member};
use crate::overrides::Author;
use crate::redis_store::{ReserveCall, only_answer};
use crate::scripts::{FAIR, RELEASE, WAKE};
use crate::store::{Ping, Store};
use crate::{
    budgets::Calendar, keys::EntityKeys, keys::RuleRef, overrides::AuditEntry, overrides::OverrideChange,
    redis_store::DispatchClaim, redis_store::MessageOf, redis_store::RedisStore, request::ParkedBody,
    request::Reserved, request::SlotRequest, request::StoreError, request::StoreFuture,
};

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Ping for RedisStore<C> {
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut self.connection()).await?;
            Ok(())
        })
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for RedisStore<C> {
    /// In a call of its own, or with the others that arrive while one is in flight
    /// ([`RedisStore::with_batching`]).
    fn reserve<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(async move {
            if let Some(group) = self.reserve_group() {
                let event = EncodedEvent::new(self.namespace(), &self.keys(request), request);
                return group.clone().submit((event, request.now())).await;
            }
            only_answer(self.reserve_batch(std::slice::from_ref(request)).await?)
        })
    }

    /// Rewrites the message's answer as completed. Rust knows the whole answer, so this is a plain
    /// HSET and PEXPIRE in one round trip, not a script (it is on every push's path); the expiry
    /// is the one reserve.lua gave the hash.
    fn complete<'a>(&'a self, request: &'a SlotRequest<'a>, reserved: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let keys = self.keys(request);
            let base = keys.answers_base;
            let value = field::completed_answer(&reserved.reservation, base, request.event.cost);
            let ttl = (base - reserved.now).max(0) + answers_keep(request.event.max_delay);
            let mut pipe = redis::pipe();
            pipe.hset(&keys.answers, keys.answer_field.as_slice(), value).ignore();
            pipe.pexpire(&keys.answers, ttl).ignore();
            let _: () = pipe.query_async(&mut self.connection()).await?;
            Ok(())
        })
    }

    fn unpark<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, (Unpark, Millis)> {
        Box::pin(async move {
            let mut unparked = self.unpark_each(std::slice::from_ref(request)).await?;
            unparked.pop().ok_or_else(|| StoreError::UnexpectedReply("no reply to an unpark".into()))
        })
    }

    fn unpark_all<'a>(&'a self, requests: &'a [SlotRequest<'a>]) -> StoreFuture<'a, Vec<(Unpark, Millis)>> {
        Box::pin(self.unpark_each(requests))
    }

    fn park_body<'a>(&'a self, request: &'a SlotRequest<'a>, body: &'a [u8], ttl: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.keys(request).parked_body_key();
            let _: () = self.connection().pset_ex(key, body, ttl.max(1) as u64).await?;
            Ok(())
        })
    }

    fn parked_bodies<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Option<ParkedBody>>> {
        Box::pin(async move {
            let keys = EntityKeys::of_entity(self.namespace(), RuleRef::of_entity(rule, key), key, &rule.limits);
            self.bodies_of(&keys.parked_queue(), count).await
        })
    }

    fn handing<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Vec<Option<ParkedBody>>> {
        Box::pin(async move {
            let keys = EntityKeys::of_entity(self.namespace(), RuleRef::of_entity(rule, key), key, &rule.limits);
            self.bodies_of(&keys.handing_list(), usize::MAX).await
        })
    }

    fn handed_over<'a>(&'a self, request: &'a SlotRequest<'a>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let keys = self.keys(request);
            if let Some(body) = request.parked_body {
                let _: () = self.connection().lrem(keys.handing_list(), 1, keys.parked_entry_with(body)).await?;
                return Ok(());
            }
            let mut pipe = redis::pipe();
            pipe.lrem(keys.handing_list(), 1, keys.parked_entry()).ignore();
            pipe.del(keys.parked_body_key()).ignore();
            let _: () = pipe.query_async(&mut self.connection()).await?;
            Ok(())
        })
    }

    fn arm_wake<'a>(&'a self, rule: &'a Rule, key: &'a str, wanted: Millis) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(async move {
            let keys = EntityKeys::of_entity(self.namespace(), RuleRef::of_entity(rule, key), key, &rule.limits);
            let mut invocation = WAKE.call();
            invocation.key(&keys.state).arg(self.clock().now().map(|t| t.to_string()).unwrap_or_default()).arg(wanted);
            Ok(invocation.invoke_async(&mut self.connection()).await?)
        })
    }

    fn fair_ring<'a>(&'a self, fair: FairRing<'a>) -> StoreFuture<'a, Ring> {
        Box::pin(async move {
            let [ring, drain] = fair_keys(self.namespace(), fair);
            let mut pipe = redis::pipe();
            pipe.zrange(&ring, 0, -1).hget(&drain, "c");
            let (members, cursor): (Vec<String>, Option<u64>) = pipe.query_async(&mut self.connection()).await?;
            let members = members.iter().filter_map(|m| member_of(m)).collect();
            Ok(Ring { members, cursor: cursor.unwrap_or(0) })
        })
    }

    fn fair_leave<'a>(
        &'a self,
        fair: FairRing<'a>,
        rule: Option<&'a Rule>,
        member: &'a Member,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let [ring, drain] = fair_keys(self.namespace(), fair);
            let mut invocation = FAIR.call();
            invocation.key(&ring).key(&drain);
            if let Some(rule) = rule {
                invocation.key(
                    EntityKeys::of_entity(
                        self.namespace(),
                        RuleRef::of_entity(rule, &member.key),
                        &member.key,
                        &rule.limits,
                    )
                    .state,
                );
            }
            invocation.arg("leave").arg(ring_member(member));
            let left: i64 = invocation.invoke_async(&mut self.connection()).await?;
            Ok(left == 1)
        })
    }

    fn fair_turned<'a>(
        &'a self,
        fair: FairRing<'a>,
        cursor: u64,
        wake: Option<Millis>,
    ) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(async move {
            let [ring, drain] = fair_keys(self.namespace(), fair);
            let mut invocation = FAIR.call();
            let now = self.clock().now().map(|t| t.to_string()).unwrap_or_default();
            let wake = wake.map(|w| w.to_string()).unwrap_or_default();
            invocation.key(&ring).key(&drain).arg("turned").arg(now).arg(cursor).arg(wake);
            Ok(invocation.invoke_async(&mut self.connection()).await?)
        })
    }

    fn release<'a>(&'a self, request: &'a SlotRequest<'a>, _: &'a Reserved) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let keys = self.keys(request);
            let mut invocation = RELEASE.call();
            invocation.key(&keys.answers).arg(keys.answer_field.as_slice());
            let _: i64 = invocation.invoke_async(&mut self.connection()).await?;
            Ok(())
        })
    }

    fn correct_cost<'a>(&'a self, request: &'a SlotRequest<'a>, actual: u64) -> StoreFuture<'a, Correction> {
        Box::pin(async move {
            let mut args = ReserveArgs::new(request.now());
            args.correction(self.namespace(), &self.keys(request), request, actual);
            let reply = self.run_reserve(ReserveCall(args)).await?;
            // Less than booked gives units back: a leased budget's pool returns them.
            let targets = crate::args::lease_targets(self.namespace(), request);
            self.send_returns(targets.iter().flatten().collect()).await;
            crate::reply::Reply::correction(&reply, actual)
        })
    }

    /// Idempotent: a redelivery stores the same bytes again.
    fn put_payload<'a>(&'a self, of: MessageOf<'a>, payload: &'a [u8], ttl: Millis) -> StoreFuture<'a, String> {
        Box::pin(async move {
            let reference = payload_key(self.namespace(), of.rule, of.key, of.message);
            let _: () = self.connection().pset_ex(&reference, payload, ttl.max(1) as u64).await?;
            Ok(reference)
        })
    }

    fn inspect<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, EntityReport> {
        Box::pin(self.entity_report(rule, key))
    }

    fn change_override<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: &'a Limit,
        set: Option<LimitOverride>,
        by: Author<'a>,
    ) -> StoreFuture<'a, OverrideChange> {
        Box::pin(self.write_override(RuleRef::of(rule), key, limit, set, by))
    }

    fn overrides<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, BTreeMap<String, LimitOverride>> {
        Box::pin(self.entity_overrides(RuleRef::of(rule), key))
    }

    fn list_overrides<'a>(
        &'a self,
        rule: &'a Rule,
    ) -> StoreFuture<'a, BTreeMap<String, BTreeMap<String, LimitOverride>>> {
        Box::pin(self.rule_overrides(RuleRef::of(rule)))
    }

    fn audit_history<'a>(&'a self, rule: &'a Rule, count: usize) -> StoreFuture<'a, Vec<AuditEntry>> {
        Box::pin(self.audit_entries(&rule.id, count))
    }

    /// A later pause already set is kept.
    fn pause<'a>(&'a self, rule: &'a Rule, key: &'a str, until: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            match Calendar::of_classes(rule, key) {
                Some(classes) => self.pause_calendar(classes, until).await,
                None => {
                    let until = until.to_string();
                    self.run_override(RuleRef::of_entity(rule, key), key, ["pause", "", "", &until]).await.map(drop)
                }
            }
        })
    }

    fn pause_budget<'a>(&'a self, budget: &'a Budget, until: Millis) -> StoreFuture<'a, ()> {
        Box::pin(self.pause_calendar(Calendar::Budget(budget), until))
    }

    fn resume<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(async move {
            if let Some(classes) = Calendar::of_classes(rule, key) {
                return self.resume_calendar(classes).await;
            }
            let ended = self.run_override(RuleRef::of_entity(rule, key), key, ["resume", "", "", ""]).await?;
            Ok(ended.first().copied())
        })
    }

    fn resume_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(self.resume_calendar(Calendar::Budget(budget)))
    }

    fn signal<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<u64>> {
        Box::pin(async move {
            if let Some(classes) = Calendar::of_classes(rule, key) {
                return self.signal_calendar(classes).await;
            }
            let Some(adaptive) = &rule.adaptive else { return Ok(None) };
            self.signal_entity(RuleRef::of_entity(rule, key), key, (adaptive, &rule.limits)).await.map(Some)
        })
    }

    fn signal_budget<'a>(&'a self, budget: &'a Budget) -> StoreFuture<'a, Option<u64>> {
        Box::pin(self.signal_calendar(Calendar::Budget(budget)))
    }

    fn report_latency<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        Box::pin(async move {
            if let Some(classes) = Calendar::of_classes(rule, key) {
                return self.report_calendar_latency(classes, report).await;
            }
            let Some(adaptive) = &rule.adaptive else { return Ok(None) };
            self.entity_latency(RuleRef::of_entity(rule, key), key, (adaptive, &rule.limits), report).await
        })
    }

    fn report_budget_latency<'a>(
        &'a self,
        budget: &'a Budget,
        report: LatencyReport,
    ) -> StoreFuture<'a, Option<LatencyChange>> {
        Box::pin(self.report_calendar_latency(Calendar::Budget(budget), report))
    }

    fn frontier<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(self.entity_frontier(RuleRef::of_entity(rule, key), key))
    }

    fn paused_until<'a>(&'a self, rule: &'a Rule, key: &'a str) -> StoreFuture<'a, Option<Millis>> {
        Box::pin(self.pause_end(rule, key))
    }

    fn record_audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        Box::pin(self.audit(entry.rule(), entry))
    }

    fn get_payload<'a>(&'a self, reference: &'a str) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move { Ok(self.connection().get(reference).await?) })
    }

    fn keep_payload<'a>(&'a self, reference: &'a str, ttl: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let command = redis::cmd("PEXPIRE").arg(reference).arg(ttl.max(1)).arg("GT").clone();
            let _: i64 = command.query_async(&mut self.connection()).await?;
            Ok(())
        })
    }

    /// SET NX semantics.
    fn claim_dispatch<'a>(&'a self, of: MessageOf<'a>, lease: Millis) -> StoreFuture<'a, DispatchClaim> {
        Box::pin(async move {
            match self.dispatch_op(of, "claim", lease).await?.as_str() {
                "acquired" => Ok(DispatchClaim::Acquired),
                "busy" => Ok(DispatchClaim::Busy),
                "done" => Ok(DispatchClaim::Done),
                other => Err(StoreError::UnexpectedReply(other.to_owned())),
            }
        })
    }

    /// The marker is kept at least [`DISPATCHED_MEMORY`]: past the task's seal, so that a captured
    /// task can never publish again.
    fn finish_dispatch<'a>(&'a self, of: MessageOf<'a>, memory: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.dispatch_op(of, "done", memory.max(DISPATCHED_MEMORY)).await.map(drop) })
    }

    fn release_dispatch<'a>(&'a self, of: MessageOf<'a>) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.dispatch_op(of, "release", 1).await.map(drop) })
    }

    fn busiest_keys<'a>(&'a self, rule: &'a Rule, count: usize, examine: usize) -> StoreFuture<'a, BusyKeys> {
        Box::pin(self.busiest(rule, count, examine))
    }

    fn slots_since<'a>(&'a self, rule: &'a Rule, key: &'a str, since: Millis) -> StoreFuture<'a, Vec<Millis>> {
        Box::pin(async move {
            let now = self.store_now().await?;
            self.reserved_slots(rule, key, (since, now)).await
        })
    }

    fn count_answer<'a>(&'a self, rule: &'a Rule, status: u16) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.count_refusal(rule, status, self.store_now().await?).await })
    }

    fn answers_since<'a>(&'a self, rule: &'a Rule, since: Millis) -> StoreFuture<'a, BTreeMap<u16, u64>> {
        Box::pin(async move { self.refusals_since(rule, (since, self.store_now().await?)).await })
    }

    /// `SET NX` of 32 random bytes, then `GET`: whichever instance came first made it.
    fn shared_secret<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            let mut fresh = [0u8; 32];
            getrandom::fill(&mut fresh).map_err(|e| StoreError::UnexpectedReply(format!("no randomness: {e}")))?;
            let name = crate::keys::secret_key(self.namespace(), name);
            let mut connection = self.connection();
            let _: Option<String> =
                redis::cmd("SET").arg(&name).arg(fresh.as_slice()).arg("NX").query_async(&mut connection).await?;
            let secret: Vec<u8> = connection.get(&name).await?;
            Ok(secret)
        })
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisStore<C> {
    /// The bodies of the first `count` entries of a parked queue or handing list, in order: kept
    /// in the entry, or beside it (read in one `MGET`).
    async fn bodies_of(&self, list: &str, count: usize) -> Result<Vec<Option<ParkedBody>>, StoreError> {
        let last = isize::try_from(count).map_or(-1, |count| count - 1);
        let entries: Vec<Vec<u8>> = self.connection().lrange(list, 0, last).await?;
        let found: Vec<Option<EntryBody>> = entries.iter().map(|entry| EntryBody::of(entry)).collect();
        let beside: Vec<&[u8]> = found
            .iter()
            .filter_map(|body| match body {
                Some(EntryBody::At(key)) => Some(key.as_slice()),
                _ => None,
            })
            .collect();
        let read: Vec<Option<Vec<u8>>> = if beside.is_empty() {
            Vec::new()
        } else {
            redis::cmd("MGET").arg(beside).query_async(&mut self.connection()).await?
        };
        let mut read = read.into_iter();
        let bodies = found.into_iter().map(|body| match body {
            Some(EntryBody::Kept(body)) => Some(ParkedBody { body: body.to_vec(), in_entry: true }),
            Some(EntryBody::At(_)) => read.next().flatten().map(|body| ParkedBody { body, in_entry: false }),
            None => None,
        });
        Ok(bodies.collect())
    }
}
