//! Group commit of reservations (`drip_batch`): the reservations that arrive while a lane's
//! script calls are in flight go together in its next `reserve.lua` call. A lane is the whole
//! connection on a single Redis, and one hash tag on a Cluster (a script call touches one slot;
//! calls for different tags run concurrently). Each event keeps its own answer: a batch is, by
//! definition, its events reserved one after another in order (`reserve.lua`, checked against the
//! model by the differential test).

use std::sync::Arc;

use drip_batch::{Flush, GroupCommit, up_to};
use drip_core::time::Millis;
use redis::aio::ConnectionLike;

use crate::args::EncodedEvent;
use crate::{RedisStore, Reserved, StoreError, StoreFuture};

/// How reservations are grouped into script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// The most events one call carries (1: no batching, one call per event).
    pub max_batch: usize,
    /// Calls of one lane in flight at once, so that Redis is not idle while a reply travels
    /// (measured with `./run bench`: four beat two and eight).
    pub max_in_flight: usize,
    /// A lane per hash tag (Redis Cluster) instead of one per connection.
    pub per_tag: bool,
}

impl Batching {
    pub fn new(max_batch: usize, per_tag: bool) -> Self {
        Self { max_batch: max_batch.max(1), max_in_flight: 4, per_tag }
    }
}

/// Events of different lanes never share a call: a Cluster's hash tag, and the caller's clock
/// (`None`: Redis `TIME`, as in production; tests pass their own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LaneKey {
    tag: String,
    now: Option<Millis>,
}

/// One `reserve.lua` call for a batch, on a store that does not batch itself.
pub(crate) struct ReserveCalls<C> {
    store: RedisStore<C>,
    batching: Batching,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Flush for ReserveCalls<C> {
    type Lane = LaneKey;
    type Item = EncodedEvent;
    type Output = Result<Reserved, StoreError>;

    fn take(&self, waiting: &mut dyn Iterator<Item = &EncodedEvent>) -> usize {
        up_to(self.batching.max_batch, waiting)
    }

    async fn flush(&self, lane: &LaneKey, events: Vec<EncodedEvent>) -> Vec<Self::Output> {
        let count = events.len();
        match self.store.reserve_encoded(lane.now, events).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(error) => {
                let error = Arc::new(error);
                (0..count).map(|_| Err(StoreError::Batch(error.clone()))).collect()
            }
        }
    }
}

/// A store's group of reservations, whatever its connection type.
pub(crate) trait ReserveGroup: Send + Sync {
    /// Reserves `event` in its lane's next call.
    fn reserve(self: Arc<Self>, event: EncodedEvent, now: Option<Millis>) -> StoreFuture<'static, Reserved>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> ReserveGroup for GroupCommit<ReserveCalls<C>> {
    fn reserve(self: Arc<Self>, event: EncodedEvent, now: Option<Millis>) -> StoreFuture<'static, Reserved> {
        let tag = if self.flusher().batching.per_tag { hash_tag(event.first_key()).to_owned() } else { String::new() };
        Box::pin(async move {
            self.submit(LaneKey { tag, now }, event)
                .await
                .unwrap_or_else(|| Err(StoreError::UnexpectedReply("the batch's call never answered".into())))
        })
    }
}

pub(crate) fn group<C: ConnectionLike + Clone + Send + Sync + 'static>(
    store: RedisStore<C>,
    batching: Batching,
) -> Arc<dyn ReserveGroup> {
    GroupCommit::new(ReserveCalls { store, batching }, batching.max_in_flight)
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
