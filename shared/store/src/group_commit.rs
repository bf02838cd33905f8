//! Group commit of reservations: while a lane's script calls are in flight, the reservations that
//! arrive wait, and the next call carries them all (up to `max_batch`). There is no timer: a lone
//! reservation goes at once, so a push on an idle limiter waits no longer than without batching.
//!
//! A lane is the whole connection on a single Redis, and one hash tag on a Cluster (a script
//! call touches one slot; calls for different tags run concurrently). Each event keeps its own
//! answer: a batch is, by definition, its events reserved one after another in order
//! (`reserve.lua`, checked against the model by the differential test).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use drip_core::time::Millis;
use redis::aio::ConnectionLike;
use tokio::sync::oneshot;

use crate::args::EncodedEvent;
use crate::{RedisStore, Reserved, StoreError};

/// How reservations are grouped into script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// The most events one call carries (1: no batching, one call per event).
    pub max_batch: usize,
    /// Calls of one lane in flight at once, so that Redis is not idle while a reply travels.
    pub max_in_flight: usize,
    /// A lane per hash tag (Redis Cluster) instead of one per connection.
    pub per_tag: bool,
}

impl Batching {
    pub const OFF: Batching = Batching { max_batch: 1, max_in_flight: usize::MAX, per_tag: false };

    pub fn new(max_batch: usize, per_tag: bool) -> Self {
        Self { max_batch: max_batch.max(1), max_in_flight: 4, per_tag }
    }
}

/// Events of different lanes never share a call: a Cluster's hash tag, and the caller's clock
/// (`None`: Redis `TIME`, as in production; tests pass their own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LaneKey {
    tag: String,
    now: Option<Millis>,
}

struct Waiting {
    event: EncodedEvent,
    reply: oneshot::Sender<Result<Reserved, StoreError>>,
}

#[derive(Default)]
struct Lane {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

pub(crate) struct GroupCommit {
    batching: Batching,
    lanes: Mutex<HashMap<LaneKey, Lane>>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("batching", &self.batching).finish_non_exhaustive()
    }
}

/// `{tag}` of a key, or the whole key when it has none.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}').map(|close| &key[open + 1..open + 1 + close]))
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

impl GroupCommit {
    pub(crate) fn new(batching: Batching) -> Self {
        Self { batching, lanes: Mutex::new(HashMap::new()) }
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<LaneKey, Lane>> {
        // A panic while holding the lock cannot leave a lane half-changed: every change is one step.
        self.lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves `event` in the lane's next call; starts a call at once when the lane has room.
    pub(crate) async fn reserve<C>(
        self: &Arc<Self>,
        store: &RedisStore<C>,
        event: EncodedEvent,
        now: Option<Millis>,
    ) -> Result<Reserved, StoreError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let tag = if self.batching.per_tag { hash_tag(event.first_key()).to_owned() } else { String::new() };
        let lane = LaneKey { tag, now };
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes();
            let entry = lanes.entry(lane.clone()).or_default();
            entry.waiting.push_back(Waiting { event, reply });
            let start = entry.in_flight < self.batching.max_in_flight;
            if start {
                entry.in_flight += 1;
            }
            start
        };
        if start {
            // Its own task: a caller that gives up (a deadline) must not strand the others' answers.
            tokio::spawn(Arc::clone(self).drive(store.clone(), lane));
        }
        answer.await.unwrap_or_else(|_| Err(StoreError::UnexpectedReply("the batch's call was dropped".into())))
    }

    /// Sends the lane's waiting events, a batch at a time, until none wait.
    async fn drive<C>(self: Arc<Self>, store: RedisStore<C>, lane: LaneKey)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        loop {
            let batch: Vec<Waiting> = {
                let mut lanes = self.lanes();
                let Some(entry) = lanes.get_mut(&lane) else { return };
                if entry.waiting.is_empty() {
                    entry.in_flight -= 1;
                    if entry.in_flight == 0 {
                        lanes.remove(&lane);
                    }
                    return;
                }
                let take = entry.waiting.len().min(self.batching.max_batch);
                entry.waiting.drain(..take).collect()
            };
            let (events, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.event, w.reply)).unzip();
            match store.reserve_encoded(lane.now, events).await {
                Ok(answers) => {
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        let _ = reply.send(Ok(answer));
                    }
                }
                Err(error) => {
                    let error = Arc::new(error);
                    for reply in replies {
                        let _ = reply.send(Err(StoreError::Batch(error.clone())));
                    }
                }
            }
        }
    }
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
