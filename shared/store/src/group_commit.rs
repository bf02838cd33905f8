//! Group commit (`drip_batch`) of reservations and of the dispatcher's once-only markers: what
//! arrives while a lane's script calls are in flight goes together in its next `reserve.lua` (or
//! `dispatch.lua`) call. A lane is the whole
//! connection on a single Redis, and one hash tag on a Cluster (a script call touches one slot;
//! calls for different tags run concurrently). Each event keeps its own answer: a batch is, by
//! definition, its events reserved one after another in order (`reserve.lua`, checked against the
//! model by the differential test).

use std::sync::Arc;

use drip_batch::{Flush, GroupCommit, fan_out, up_to};
use drip_core::time::Millis;

use crate::args::EncodedEvent;
use crate::{request::Reserved, request::StoreError, request::StoreFuture};

/// The unbatched script calls a batch is made of (the Redis store's): group commit knows them by
/// this, not by the store, so the store can hold its groups.
pub(crate) trait ScriptCalls: Clone + Send + Sync + 'static {
    /// One `reserve.lua` call for `events`, decided at `now` (`None`: Redis `TIME`).
    fn reserve_encoded(
        &self,
        now: Option<Millis>,
        events: Vec<EncodedEvent>,
    ) -> impl Future<Output = Result<Vec<Reserved>, StoreError>> + Send;
    /// One `dispatch.lua` call for `ops`.
    fn dispatch_ops(&self, ops: &[DispatchOp]) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
}

/// How reservations are grouped into script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// The most events one call carries (1: no batching, one call per event).
    pub max_batch: usize,
    /// Calls of one lane in flight at once, so that Redis is not idle while a reply travels
    /// (measured with `./run bench`: four beat two and eight).
    pub max_in_flight: usize,
    /// Calls in flight at once on a lane of a leased budget's partition: one. Calls in flight
    /// together find its pool empty together, and each stops and is sent again after the lease;
    /// one at a time, the others wait and go as one larger call (docs/capacity.md, "One call at a
    /// time on a leased lane").
    pub leased_in_flight: usize,
    /// A lane per hash tag (Redis Cluster) instead of one per connection.
    pub per_tag: bool,
}

impl Batching {
    pub fn new(max_batch: usize, per_tag: bool) -> Self {
        Self { max_batch: max_batch.max(1), max_in_flight: 4, leased_in_flight: 1, per_tag }
    }
}

/// Events of different lanes never share a call: a Cluster's hash tag, and the caller's clock
/// (`None`: Redis `TIME`, as in production; tests pass their own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LaneKey {
    tag: String,
    now: Option<Millis>,
    /// Its events draw from a leased budget (their calls may stop for a lease).
    leased: bool,
}

/// A call's answers, one per item; a failed call is every item's failure.
fn each<T>(count: usize, call: Result<Vec<T>, StoreError>) -> Vec<Result<T, StoreError>> {
    fan_out(count, call.map_err(Arc::new)).into_iter().map(|answer| answer.map_err(StoreError::Batch)).collect()
}

/// One `reserve.lua` call for a batch, on a store that does not batch itself.
pub(crate) struct ReserveCalls<S> {
    store: S,
    batching: Batching,
}

impl<S: ScriptCalls> Flush for ReserveCalls<S> {
    type Lane = LaneKey;
    type Item = EncodedEvent;
    type Output = Result<Reserved, StoreError>;

    fn take(&self, waiting: &mut dyn Iterator<Item = &EncodedEvent>) -> usize {
        up_to(self.batching.max_batch, waiting)
    }

    async fn flush(&self, lane: &LaneKey, events: Vec<EncodedEvent>) -> Vec<Self::Output> {
        let count = events.len();
        each(count, self.store.reserve_encoded(lane.now, events).await)
    }

    fn in_flight_of(&self, lane: &LaneKey) -> Option<usize> {
        lane.leased.then_some(self.batching.leased_in_flight)
    }
}

/// One dispatcher marker operation (`lua/dispatch.lua`): 'claim', 'done' or 'release' with its TTL.
#[derive(Debug, Clone)]
pub(crate) struct DispatchOp {
    pub marker: String,
    pub payload: String,
    pub op: &'static str,
    pub ttl: Millis,
}

/// One `dispatch.lua` call for a batch of marker operations.
pub(crate) struct DispatchCalls<S> {
    store: S,
    batching: Batching,
}

impl<S: ScriptCalls> Flush for DispatchCalls<S> {
    type Lane = String;
    type Item = DispatchOp;
    type Output = Result<String, StoreError>;

    fn take(&self, waiting: &mut dyn Iterator<Item = &DispatchOp>) -> usize {
        up_to(self.batching.max_batch, waiting)
    }

    async fn flush(&self, _: &String, ops: Vec<DispatchOp>) -> Vec<Self::Output> {
        each(ops.len(), self.store.dispatch_ops(&ops).await)
    }
}

/// A store's group of calls, whatever its connection type: `submit` puts the item in its lane's
/// next call.
pub(crate) trait Grouped<I, O>: Send + Sync {
    fn submit(self: Arc<Self>, item: I) -> StoreFuture<'static, O>;
}

fn never_answered<T>() -> Result<T, StoreError> {
    Err(StoreError::UnexpectedReply("the batch's call never answered".into()))
}

impl<S: ScriptCalls> Grouped<(EncodedEvent, Option<Millis>), Reserved> for GroupCommit<ReserveCalls<S>> {
    fn submit(self: Arc<Self>, (event, now): (EncodedEvent, Option<Millis>)) -> StoreFuture<'static, Reserved> {
        let (tag, leased) = (lane_of(self.flusher().batching, event.first_key()), event.leased());
        Box::pin(async move {
            GroupCommit::submit(&self, LaneKey { tag, now, leased }, event).await.unwrap_or_else(never_answered)
        })
    }
}

impl<S: ScriptCalls> Grouped<DispatchOp, String> for GroupCommit<DispatchCalls<S>> {
    fn submit(self: Arc<Self>, op: DispatchOp) -> StoreFuture<'static, String> {
        let tag = lane_of(self.flusher().batching, &op.marker);
        Box::pin(async move { GroupCommit::submit(&self, tag, op).await.unwrap_or_else(never_answered) })
    }
}

fn lane_of(batching: Batching, key: &str) -> String {
    if batching.per_tag { hash_tag(key).to_owned() } else { String::new() }
}

pub(crate) type ReserveGroup = dyn Grouped<(EncodedEvent, Option<Millis>), Reserved>;
pub(crate) type DispatchGroup = dyn Grouped<DispatchOp, String>;

/// The store's two groups: reservations, and the dispatcher's marker operations.
pub(crate) fn groups<S: ScriptCalls>(store: S, batching: Batching) -> (Arc<ReserveGroup>, Arc<DispatchGroup>) {
    let reserve = GroupCommit::new(ReserveCalls { store: store.clone(), batching }, batching.max_in_flight);
    let dispatch = GroupCommit::new(DispatchCalls { store, batching }, batching.max_in_flight);
    (reserve, dispatch)
}

/// `{tag}` of a key, or the whole key when it has none.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}').map(|close| &key[open + 1..open + 1 + close]))
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn a_lane_is_the_keys_hash_tag() {
        assert_eq!(hash_tag("drip:{rule|key}:state"), "rule|key");
        assert_eq!(hash_tag("drip:{b:payouts}:r|k:state"), "b:payouts");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("x:{}:y"), "x:{}:y");
    }
}
