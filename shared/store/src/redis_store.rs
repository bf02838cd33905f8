use std::sync::Arc;

use drip_core::schedule::{Lease, Unpark, lease_term, nests_in};
use drip_core::time::Millis;
use redis::aio::ConnectionLike;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::args::{Credit, EncodedEvent, LeaseTarget, ReserveArgs, ReservePaths};
use crate::group_commit::{Batching, DispatchGroup, DispatchOp, ReserveGroup, ScriptCalls};
use crate::keys::field;
use crate::keys::{STATE_MARGIN, dispatch_key, payload_key};
use crate::reply::{REPLY_LENGTH, Reply};
use crate::scripts::{DISPATCH, LEASE, RESERVE, RETURNS};
use crate::{keys::EntityKeys, request::Clock, request::Reserved, request::SlotRequest, request::StoreError};

/// The one answer of a call that carried one item.
pub(crate) fn only_answer<T>(mut answers: Vec<T>) -> Result<T, StoreError> {
    answers.pop().filter(|_| answers.is_empty()).ok_or_else(|| StoreError::UnexpectedReply("no answer".into()))
}

/// What the dispatcher may do with a task's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchClaim {
    /// This attempt publishes; it must then call `finish_dispatch` or `release_dispatch`.
    Acquired,
    /// Another attempt is publishing it now.
    Busy,
    /// Already published.
    Done,
}

/// One message of one entity, as the dispatcher names it.
#[derive(Debug, Clone, Copy)]
pub struct MessageOf<'a> {
    pub rule: &'a str,
    pub key: &'a str,
    /// `MessageRef::identity`.
    pub message: &'a str,
}

/// Reservations, claim-checked payloads and dispatch markers in Redis or Redis Cluster. `C` is any
/// async connection: a multiplexed connection, a connection manager, or a cluster connection;
/// cloning it must be cheap.
#[derive(Clone)]
pub struct RedisStore<C> {
    connection: C,
    namespace: String,
    /// `None`: one script call per reservation and per marker operation.
    groups: Option<(Arc<ReserveGroup>, Arc<DispatchGroup>)>,
    /// By pool: one caller at a time asks its home for a lease (`LeaseGates`).
    lease_gates: Arc<LeaseGates>,
    lease_observer: Option<Arc<dyn LeaseObserver>>,
    clock: Clock,
    paths: ReservePaths,
}

/// Told of each lease a budget's home grants (the services count them: `drip_budget_leases`).
pub trait LeaseObserver: Send + Sync {
    /// `units` of `budget` leased to a partition; 0 when the home had no room up to the horizon.
    fn leased(&self, budget: &str, units: u64);
    /// `units` of `budget` given back to its home by a partition (events left their windows).
    fn returned(&self, budget: &str, units: u64);
}

/// Callers whose reservations stop for a lease of the same pool ask its home one at a time: the
/// first asks and sends its event again with the lease while the others wait, and a waiter whose
/// pool was leased meanwhile sends its event again without asking. Otherwise every caller that
/// finds a pool empty at once would lease a chunk, and the home would lease a window out to
/// partitions that book a unit of each chunk (stranding all the rest).
#[derive(Default)]
struct LeaseGates(std::sync::Mutex<std::collections::HashMap<String, Arc<LeaseGate>>>);

#[derive(Default)]
struct LeaseGate {
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Leases asked for through this gate so far.
    leased: AtomicU64,
    /// By (per, window): the costs of the callers waiting for their turn to ask for it.
    waiting: std::sync::Mutex<std::collections::HashMap<(Millis, Millis), u64>>,
}

impl LeaseGate {
    /// Adds `cost` (or takes it away) to what callers wait for of `(per, window)`; returns what
    /// the others wait for.
    fn wait(&self, at: (Millis, Millis), cost: u64, arriving: bool) -> u64 {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let total = waiting.entry(at).or_default();
        if arriving {
            *total += cost;
        } else {
            *total = total.saturating_sub(cost);
        }
        let others = total.saturating_sub(if arriving { cost } else { 0 });
        if *total == 0 {
            waiting.remove(&at);
        }
        others
    }
}

impl LeaseGates {
    fn of(&self, pool: &str) -> Arc<LeaseGate> {
        let mut gates = self.0.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(pool.to_owned()).or_default().clone()
    }
}

impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl<C> RedisStore<C> {
    pub fn new(connection: C, namespace: impl Into<String>) -> Self {
        Self {
            connection,
            namespace: namespace.into(),
            groups: None,
            lease_gates: Default::default(),
            lease_observer: None,
            clock: Clock::default(),
            paths: ReservePaths::Lean,
        }
    }

    pub fn keys(&self, request: &SlotRequest<'_>) -> EntityKeys {
        EntityKeys::new(
            &self.namespace,
            request.rule_ref(),
            request.key,
            request.event.message_id,
            request.event.published,
            request.event.limits,
        )
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The clock overrides, pauses, signals and latency reports are decided at: Redis `TIME`
    /// until a test or the simulator sets it; a reservation keeps its own (`SlotRequest::at`).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Tells `observer` of each lease a leased budget's home grants.
    pub fn with_lease_observer(self, observer: Arc<dyn LeaseObserver>) -> Self {
        Self { lease_observer: Some(observer), ..self }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    /// Where reservations go together, when batching is on ([`RedisStore::with_batching`]).
    pub(crate) fn reserve_group(&self) -> Option<&Arc<ReserveGroup>> {
        self.groups.as_ref().map(|(group, _)| group)
    }

    pub(crate) fn connection(&self) -> C {
        self.connection.clone()
    }

    /// The store's clock as a script's `now` argument: the time set, or '' (the script reads `TIME`).
    pub(crate) fn clock_arg(&self) -> String {
        self.clock.now().map(|now| now.to_string()).unwrap_or_default()
    }

    /// The store's clock: the manual time, or Redis `TIME`.
    pub(crate) async fn store_now(&self) -> Result<Millis, StoreError> {
        if let Some(now) = self.clock.now() {
            return Ok(now);
        }
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut self.connection()).await?;
        Ok(seconds * 1_000 + micros / 1_000)
    }

    pub(crate) async fn dispatch_op(
        &self,
        of: MessageOf<'_>,
        op: &'static str,
        ttl: Millis,
    ) -> Result<String, StoreError> {
        let op = DispatchOp {
            marker: dispatch_key(&self.namespace, of.rule, of.key, of.message),
            payload: payload_key(&self.namespace, of.rule, of.key, of.message),
            op,
            ttl: ttl.max(1),
        };
        if let Some((_, group)) = &self.groups {
            return group.clone().submit(op).await;
        }
        only_answer(self.dispatch_ops(std::slice::from_ref(&op)).await?)
    }

    /// Several marker operations in one `dispatch.lua` call (every key in one hash slot, on a Cluster).
    pub(crate) async fn dispatch_ops(&self, ops: &[DispatchOp]) -> Result<Vec<String>, StoreError> {
        let mut invocation = DISPATCH.call();
        invocation.arg(ops.len());
        for op in ops {
            invocation.key(&op.marker).key(&op.payload).arg(op.op).arg(op.ttl);
        }
        let results: Vec<String> = invocation.invoke_async(&mut self.connection()).await?;
        if results.len() != ops.len() {
            return Err(StoreError::UnexpectedReply(format!("{} answers to {} operations", results.len(), ops.len())));
        }
        Ok(results)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    /// Reserves each request's slot, one after another in order, in one script call (every key of
    /// every request in one hash slot, on a Cluster). Each gets its own answer, as if reserved alone.
    pub async fn reserve_batch(&self, requests: &[SlotRequest<'_>]) -> Result<Vec<Reserved>, StoreError> {
        if !any_leased(requests) {
            // Nothing can stop the call for a lease: encoded straight into it.
            return self.call_reserve(self.reserve_batch_call(requests)).await;
        }
        self.reserve_encoded(requests.first().and_then(SlotRequest::now), self.encoded(requests)).await
    }

    /// The same for events encoded on their own (by different requests), at `now`.
    ///
    /// An event of a leased budget whose partition's pool has no units for it stops its call: its
    /// home leases the partition some (`lua/lease.lua`, a call to another slot), and the call
    /// goes on from that event with the lease credited to the pool (`Scheduler`'s `lease`).
    pub async fn reserve_encoded(
        &self,
        now: Option<Millis>,
        events: Vec<EncodedEvent>,
    ) -> Result<Vec<Reserved>, StoreError> {
        if !events.iter().any(EncodedEvent::leased) {
            let mut args = ReserveArgs::new(now).with_paths(self.paths);
            for event in events {
                args.push(event);
            }
            return self.call_reserve(ReserveCall(args)).await;
        }
        self.leasing_call(now, events).await?.chunks(REPLY_LENGTH).map(Reply::decided).collect()
    }

    /// A drain's unparks of `requests` in one call; one whose partition's pool of a leased budget
    /// needs units stops it, and it goes on from there once the home has leased them.
    pub(crate) async fn unpark_each(&self, requests: &[SlotRequest<'_>]) -> Result<Vec<(Unpark, Millis)>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let reply = if any_leased(requests) {
            self.leasing_call(requests.first().and_then(SlotRequest::now), self.encoded(requests)).await?
        } else {
            self.run_reserve(self.reserve_batch_call(requests)).await?
        };
        reply.chunks(REPLY_LENGTH).map(Reply::unpark).collect()
    }

    /// The events' replies (a reservation's or a drain's unpark, `REPLY_LENGTH` numbers each), one
    /// call after another: a call that stops at an event for a lease goes on from it once its home
    /// has leased its pool units.
    pub(crate) async fn leasing_call(
        &self,
        now: Option<Millis>,
        events: Vec<EncodedEvent>,
    ) -> Result<Vec<i64>, StoreError> {
        let mut decided = Vec::with_capacity(events.len() * REPLY_LENGTH);
        // The pools of events that gave units back since their returns last went home.
        let mut returning: Vec<LeaseTarget> = Vec::new();
        let mut waiting: VecDeque<EncodedEvent> = events.into();
        let mut credits: Vec<(String, Credit)> = Vec::new();
        // Where the event at the head of `waiting` last stopped for a lease, and how often in a
        // row it stopped there.
        let (mut stopped_at, mut stops) = (None, 0);
        // The turn at a pool's gate, held until the event is sent again.
        let mut _turn = None;
        // (After a stop the call goes again holding the turn of the pool it leased.)
        self.wait_for_leases_asked(&waiting).await;
        while stops < STOPS_AT_ONE_WINDOW {
            let mut args = ReserveArgs::new(now).with_paths(self.paths);
            for (pool, credit) in credits.drain(..) {
                args.credit(&pool, credit);
            }
            for event in &waiting {
                args.push(event.clone());
            }
            let reply = self.run_reserve(ReserveCall(args)).await;
            _turn = None;
            let reply = reply?;
            let mut wanted = None;
            for answer in reply.chunks(REPLY_LENGTH) {
                if let Reply::LeaseWanted { window, budget, limit, horizon, reach } = Reply::parse(answer)? {
                    wanted = Some((window, budget as i64, limit as i64, horizon, reach));
                } else {
                    decided.extend_from_slice(answer);
                    let event = waiting.pop_front();
                    // It gave its old slot back, or its booking gave its pools' units of a longer
                    // limit's closed window back.
                    if event.as_ref().is_some_and(|e| e.gives_back) || crate::reply::gave_back(answer) {
                        returning.extend(event.iter().flat_map(|e| e.leases.iter().flatten().cloned()));
                    }
                    (stopped_at, stops) = (None, 0);
                }
            }
            let Some((window, budget, limit, horizon, reach)) = wanted else {
                self.send_returns(each_pool_once(&returning)).await;
                return Ok(decided);
            };
            if stopped_at == Some((budget, limit, window)) {
                stops += 1;
            } else {
                (stopped_at, stops) = (Some((budget, limit, window)), 1);
            }
            let event = waiting.pop_front().ok_or_else(|| StoreError::UnexpectedReply(format!("{reply:?}")))?;
            // An event that gives its old slot back does so before its search stops for a lease.
            if event.gives_back {
                returning.extend(event.leases.iter().flatten().cloned());
            }
            let target = usize::try_from(budget - 1).ok().and_then(|b| event.leases.get(b)?.as_ref());
            let found = usize::try_from(limit - 1).ok().and_then(|j| Some((target?, *target?.limits.get(j)?)));
            let Some((target, (per, count, want))) = found else {
                return Err(StoreError::UnexpectedReply(format!(
                    "a lease for budget {budget} limit {limit}: {reply:?}"
                )));
            };
            // What this call's events gave back goes home before the home is asked (the model
            // takes it back as it is given): the lease may be of those very units.
            if !returning.is_empty() {
                self.send_returns(each_pool_once(&returning)).await;
                returning.clear();
            }
            // This call's events after it that draw from the pool will want units too.
            let behind: u64 = waiting
                .iter()
                .filter(|e| e.leases.iter().flatten().any(|l| l.pool == target.pool))
                .map(|e| e.cost)
                .sum();
            let asking = event.cost + behind;
            let gate = self.lease_gates.of(&target.pool);
            let seen = gate.leased.load(Ordering::Acquire);
            gate.wait((per, window), asking, true);
            let turn = gate.turn.clone().lock_owned().await;
            let others = gate.wait((per, window), asking, false);
            if gate.leased.load(Ordering::Acquire) == seen {
                // So will the callers of the same pool waiting behind this one for the same
                // window, and the events behind them in their calls.
                let want = want.max(asking + others);
                let span = (per, window, horizon);
                for lease in self.grant(target, (span, reach), now, (count, event.cost, want)).await? {
                    credits.push((target.pool.clone(), Credit { per, lease, keep: per + STATE_MARGIN }));
                }
                gate.leased.fetch_add(1, Ordering::AcqRel);
            }
            _turn = Some(turn);
            waiting.push_front(event.again());
        }
        Err(StoreError::UnexpectedReply(format!(
            "a reservation stopped for a lease {STOPS_AT_ONE_WINDOW} times in a row at one window"
        )))
    }

    /// Waits while another caller asks a home for a lease of a pool these events draw from: they
    /// would find it as empty as that caller did and stop there, and that caller's call goes
    /// again with the lease. A call waits so before it is first sent, holding no turn, so no two
    /// wait on each other.
    async fn wait_for_leases_asked(&self, events: &VecDeque<EncodedEvent>) {
        for target in each_pool_once(events.iter().flat_map(|e| e.leases.iter().flatten())) {
            let gate = self.lease_gates.of(&target.pool);
            if gate.turn.try_lock().is_err() {
                drop(gate.turn.lock().await);
            }
        }
    }

    /// The home's lease (`lua/lease.lua`) of one limit `(per, from, horizon)` for `target`'s
    /// partition, whose pool can book no window before `reach`: `count` in a window, for a
    /// `cost`, asking `want`.
    async fn grant(
        &self,
        target: &LeaseTarget,
        ((per, from, horizon), reach): ((Millis, Millis, Millis), Millis),
        now: Option<Millis>,
        (count, cost, want): (u64, u64, u64),
    ) -> Result<Vec<Lease>, StoreError> {
        let mut invocation = LEASE.call();
        invocation.key(&target.home).arg(now.map(|n| n.to_string()).unwrap_or_default());
        invocation.arg(target.partition).arg(target.partitions).arg(per).arg(from).arg(horizon);
        invocation
            .arg(count)
            .arg(cost)
            .arg(want)
            .arg(per + STATE_MARGIN)
            .arg(lease_term(per))
            .arg(u8::from(target.fair));
        let (ceiling, step, window) = target.level.unwrap_or_default();
        invocation.arg(ceiling).arg(step).arg(window).arg(reach);
        // The budget's longer limits whose windows hold this one's: a nearly full one leases this
        // limit as asked (`nearly_full_around`).
        let longer: Vec<_> = target.limits.iter().filter(|&&(long, _, _)| nests_in(per, long)).collect();
        invocation.arg(longer.len());
        for &(long, count, _) in longer {
            invocation.arg(long).arg(count);
        }
        let reply: Vec<i64> = invocation.invoke_async(&mut self.connection()).await?;
        let Some((&[window, total, full_through, found, units], ahead)) = reply.split_at_checked(5) else {
            return Err(StoreError::UnexpectedReply(format!("lease.lua: {reply:?}")));
        };
        if !ahead.len().is_multiple_of(2) {
            return Err(StoreError::UnexpectedReply(format!("lease.lua: {reply:?}")));
        }
        if let Some(observer) = &self.lease_observer {
            observer.leased(&target.budget, units.max(0) as u64);
        }
        let mut leases = vec![Lease { window: (found == 1).then_some(window), total: total as u64, full_through }];
        for pair in ahead.chunks(2) {
            leases.push(Lease { window: Some(pair[0]), total: pair[1] as u64, full_through });
        }
        Ok(leases)
    }

    /// Sends each pool's returns (what its events gave back of its leases, reserve.lua's
    /// `give_back_lease`, listed in its 'R' field) to its home (`lua/returns.lua`). Each is a
    /// total, so sending one again takes nothing more back; one that is not sent (a failure, logged)
    /// leaves the units stranded in the pool: unused, never a window over its count.
    pub(crate) async fn send_returns(&self, pools: Vec<&LeaseTarget>) {
        for target in pools {
            if let Err(error) = self.send_return(target).await {
                tracing::warn!(budget = %target.budget, pool = %target.pool, %error, "could not give a pool's returned units back to its home; they stay unused");
            }
        }
    }

    async fn send_return(&self, target: &LeaseTarget) -> Result<(), StoreError> {
        let listed: Option<String> =
            redis::cmd("HGET").arg(&target.pool).arg(field::POOL_RETURNS).query_async(&mut self.connection()).await?;
        let windows: Vec<(Millis, Millis)> =
            listed.iter().flat_map(|l| l.split(',')).filter_map(field::parse_budget_window).collect();
        if windows.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = windows.iter().map(|&(per, window)| field::pool_returned(per, window)).collect();
        let totals: Vec<Option<u64>> =
            redis::cmd("HMGET").arg(&target.pool).arg(&names).query_async(&mut self.connection()).await?;
        let mut invocation = RETURNS.call();
        invocation.key(&target.home).arg(target.partition);
        let returns: Vec<_> = windows.iter().zip(totals).filter_map(|(w, total)| Some((w, total?))).collect();
        invocation.arg(returns.len());
        for (&(per, window), total) in returns {
            invocation.arg(per).arg(window).arg(total);
        }
        let units: i64 = invocation.invoke_async(&mut self.connection()).await?;
        if let Some(observer) = &self.lease_observer {
            observer.returned(&target.budget, units.max(0) as u64);
        }
        Ok(())
    }

    async fn call_reserve(&self, call: ReserveCall) -> Result<Vec<Reserved>, StoreError> {
        parse_replies(&self.run_reserve(call).await?)
    }

    /// The script's reply, loading its library first when Redis does not hold it.
    pub(crate) async fn run_reserve(&self, call: ReserveCall) -> Result<Vec<i64>, StoreError> {
        Ok(RESERVE.run(&call.cmd(), &mut self.connection()).await?)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> ScriptCalls for RedisStore<C> {
    async fn reserve_encoded(
        &self,
        now: Option<Millis>,
        events: Vec<EncodedEvent>,
    ) -> Result<Vec<Reserved>, StoreError> {
        RedisStore::reserve_encoded(self, now, events).await
    }

    async fn dispatch_ops(&self, ops: &[DispatchOp]) -> Result<Vec<String>, StoreError> {
        RedisStore::dispatch_ops(self, ops).await
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisStore<C> {
    /// The same store with its lean-shaped reservations sent down `paths` (the lean path unless
    /// told: the differential tests compare all three with the model).
    pub fn with_reserve_paths(self, paths: ReservePaths) -> Self {
        Self { paths, ..self }
    }

    /// Reservations that arrive while a call is in flight go together in the next one.
    pub fn with_batching(self, batching: Batching) -> Self {
        let unbatched = Self { groups: None, ..self };
        let groups = (batching.max_batch > 1).then(|| crate::group_commit::groups(unbatched.clone(), batching));
        Self { groups, ..unbatched }
    }
}

/// One `FCALL` of `reserve.lua` with its keys and arguments, for one request or a batch of them.
#[derive(Debug, Clone)]
pub struct ReserveCall(pub(crate) ReserveArgs);

impl ReserveCall {
    /// The command (FCALL: the library must have been loaded; `FUNCTION LOAD` [`reserve_library`]).
    pub fn cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&RESERVE.name).arg(self.0.keys.len());
        for key in &self.0.keys {
            cmd.arg(key);
        }
        for arg in self.0.args().values() {
            cmd.arg(arg);
        }
        cmd
    }

    /// The call as the contract names it: each key, then each argument under the name the script
    /// reads it by (what the golden test pins).
    pub fn described(&self) -> (Vec<String>, Vec<(&'static str, Vec<u8>)>) {
        let args = self.0.args();
        (self.0.keys.clone(), args.named().map(|(name, value)| (name, value.to_vec())).collect())
    }
}

/// `reserve.lua` as the function library it runs as, for `FUNCTION LOAD`.
pub fn reserve_library() -> &'static str {
    &RESERVE.source
}

/// How often in a row one event may stop for a lease at the same window before the store gives up
/// (the caller answers 503 and the event comes again). However far its search walks, each lease
/// leases it units of the window it stopped at or tells it the home is full through it, so its
/// next stop is at a later window; only callers elsewhere that empty the pool every time between
/// its lease and its next call stop it at one window again.
const STOPS_AT_ONE_WINDOW: usize = 64;

/// Reads the reservation script's reply: `REPLY_LENGTH` numbers per event, each a decision.
pub fn parse_replies(reply: &[i64]) -> Result<Vec<Reserved>, StoreError> {
    if reply.is_empty() || !reply.len().is_multiple_of(REPLY_LENGTH) {
        return Err(StoreError::UnexpectedReply(format!("{reply:?}")));
    }
    reply.chunks(REPLY_LENGTH).map(Reply::decided).collect()
}

impl<C> RedisStore<C> {
    /// The script call that reserves `request`'s slot.
    pub fn reserve_call(&self, request: &SlotRequest<'_>) -> ReserveCall {
        self.reserve_batch_call(std::slice::from_ref(request))
    }

    /// Each of `requests` encoded on its own (a leasing call sends them again from where it stopped).
    fn encoded(&self, requests: &[SlotRequest<'_>]) -> Vec<EncodedEvent> {
        requests.iter().map(|r| EncodedEvent::new(&self.namespace, &self.keys(r), r)).collect()
    }

    /// The script call that reserves each of `requests` in order (at the first one's `now`).
    pub fn reserve_batch_call(&self, requests: &[SlotRequest<'_>]) -> ReserveCall {
        let mut args = ReserveArgs::new(requests.first().and_then(SlotRequest::now)).with_paths(self.paths);
        for request in requests {
            args.event(&self.namespace, &self.keys(request), request);
        }
        ReserveCall(args)
    }
}

/// Whether an event of `requests` draws from a leased budget (its call may stop for a lease).
fn any_leased(requests: &[SlotRequest<'_>]) -> bool {
    requests.iter().any(|r| r.event.budgets.iter().any(|b| b.leases.is_some()))
}

/// Each pool of `targets` once (the first target naming it), in their order.
fn each_pool_once<'a>(targets: impl IntoIterator<Item = &'a LeaseTarget>) -> Vec<&'a LeaseTarget> {
    let mut pools: Vec<&LeaseTarget> = Vec::new();
    for target in targets {
        if !pools.iter().any(|p| p.pool == target.pool) {
            pools.push(target);
        }
    }
    pools
}
