//! Group commit on a real Redis (and a 3-master Cluster): reservations that arrive together share
//! script calls, and each still gets the answer it would get alone, in some order of arrival.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{Attempt, Reservation, ReserveRequest};
use drip_core::time::{MINUTE, Millis, SECOND};
use drip_store::{Batching, MemoryStore, RedisStore, SlotRequest, Store};
use drip_tests::redis_server::{RedisCluster, shared_connection};
use drip_tests::unique;
use futures_util::future::join_all;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

const T0: Millis = 1_800_000_000_000;

/// A real connection that counts the commands sent through it; with `overlap`, it also slows each
/// reservation script call by 20 ms and keeps the most that were in flight at once.
#[derive(Clone)]
struct Counting<C> {
    inner: C,
    calls: Arc<AtomicUsize>,
    overlap: Option<Overlap>,
}

/// Reservation script calls in flight now, and the most at once.
#[derive(Clone, Default)]
struct Overlap {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl<C> Counting<C> {
    fn new(inner: C, calls: Arc<AtomicUsize>) -> Self {
        Self { inner, calls, overlap: None }
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Counting<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let reserve = cmd.get_packed_command().windows(12).any(|w| w == b"drip_reserve");
        let Some(overlap) = self.overlap.clone().filter(|_| reserve) else {
            return self.inner.req_packed_command(cmd);
        };
        Box::pin(async move {
            let at_once = overlap.now.fetch_add(1, Ordering::SeqCst) + 1;
            overlap.most.fetch_max(at_once, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let reply = self.inner.req_packed_command(cmd).await;
            overlap.now.fetch_sub(1, Ordering::SeqCst);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

fn limits() -> Vec<Limit> {
    vec![
        Limit::new(10, SECOND, Window::Fixed(Placement::Start)).unwrap(),
        Limit::new(300, MINUTE, Window::Sliding).unwrap(),
    ]
}

fn request<'a>(rule: &'a str, key: &'a str, id: &'a str, limits: &'a [Limit]) -> SlotRequest<'a> {
    let event = ReserveRequest {
        max_delay: 10 * MINUTE,
        lease: 5_000,
        published: Some(T0),
        ..ReserveRequest::new(id, limits, T0)
    };
    SlotRequest::new(rule, key, event).at(T0)
}

/// `events` (key, message) reserved concurrently through `store`.
async fn concurrently<C>(store: &RedisStore<C>, rule: &str, events: &[(String, String)]) -> Vec<Reservation>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let limits = limits();
    let requests: Vec<SlotRequest> = events.iter().map(|(key, id)| request(rule, key, id, &limits)).collect();
    join_all(requests.iter().map(|r| store.reserve(r)))
        .await
        .into_iter()
        .map(|r| r.expect("reserved").reservation)
        .collect()
}

/// The model's slots for the same events one after another, per key, sorted.
async fn model_slots(rule: &str, events: &[(String, String)], key: &str) -> Vec<Millis> {
    let model = MemoryStore::default();
    let limits = limits();
    let mut slots = Vec::new();
    for (k, id) in events.iter().filter(|(k, _)| k == key) {
        slots.push(model.reserve(&request(rule, k, id, &limits)).await.expect("model").reservation.slot);
    }
    slots.sort_unstable();
    slots
}

fn slots_of(events: &[(String, String)], answers: &[Reservation], key: &str) -> Vec<Millis> {
    let mut slots: Vec<Millis> =
        events.iter().zip(answers).filter(|((k, _), _)| k == key).map(|(_, a)| a.slot).collect();
    slots.sort_unstable();
    slots
}

#[tokio::test]
async fn a_hot_keys_burst_shares_calls_and_gets_the_models_slots() {
    let calls = Arc::new(AtomicUsize::new(0));
    let connection = Counting::new(shared_connection().await, calls.clone());
    let store = RedisStore::new(connection, unique("group")).with_batching(Batching::new(64, false));
    let events: Vec<(String, String)> = (0..400).map(|i| ("merchant-1".to_owned(), format!("m{i}"))).collect();

    let answers = concurrently(&store, "burst", &events).await;

    assert_eq!(slots_of(&events, &answers, "merchant-1"), model_slots("burst", &events, "merchant-1").await);
    assert!(answers.iter().all(|a| a.attempt == Attempt::Decided), "each event is decided once");
    let calls = calls.load(Ordering::Relaxed);
    assert!(calls <= 400 / 8, "400 concurrent reservations took {calls} calls: not batched");
}

#[tokio::test]
async fn a_thousand_keys_each_get_the_models_slots() {
    let store = RedisStore::new(shared_connection().await, unique("group")).with_batching(Batching::new(64, false));
    let events: Vec<(String, String)> = (0..3_000).map(|i| (format!("user-{}", i % 1_000), format!("m{i}"))).collect();

    let answers = concurrently(&store, "many", &events).await;

    for key in ["user-0", "user-499", "user-999"] {
        assert_eq!(slots_of(&events, &answers, key), model_slots("many", &events, key).await, "{key}");
    }
}

#[tokio::test]
async fn a_redelivery_in_the_same_batch_is_busy_and_keeps_the_first_answer() {
    let store = RedisStore::new(shared_connection().await, unique("group")).with_batching(Batching::new(64, false));
    let mut events: Vec<(String, String)> = (0..50).map(|i| ("k".to_owned(), format!("m{i}"))).collect();
    events.push(("k".to_owned(), "m7".to_owned()));

    let answers = concurrently(&store, "redelivered", &events).await;

    let (first, again) = (answers[7], answers[50]);
    // Whichever came first decided; the other found its lease held.
    let attempts = [first.attempt, again.attempt];
    assert!(attempts.contains(&Attempt::Busy) && attempts.contains(&Attempt::Decided), "{attempts:?}");
    assert_eq!(first.slot, again.slot, "the busy answer names the decided slot");
    let distinct: std::collections::BTreeSet<Millis> = answers[..50].iter().map(|a| a.slot).collect();
    assert_eq!(distinct.len(), 5, "50 events at 10/s fill five windows, the redelivery takes none");
}

#[tokio::test]
async fn a_lone_reservation_goes_at_once_in_its_own_call() {
    let calls = Arc::new(AtomicUsize::new(0));
    let connection = Counting::new(shared_connection().await, calls.clone());
    let store = RedisStore::new(connection, unique("group")).with_batching(Batching::new(64, false));
    let limits = limits();
    // The first call may find the script not loaded yet (NOSCRIPT, SCRIPT LOAD, again).
    store.reserve(&request("lone", "k", "warm-up", &limits)).await.expect("reserved");
    calls.store(0, Ordering::Relaxed);
    for i in 0..5 {
        let id = format!("m{i}");
        store.reserve(&request("lone", "k", &id, &limits)).await.expect("reserved");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 5, "one call per reservation that arrives alone");
}

#[tokio::test]
async fn on_a_cluster_each_hash_tag_batches_apart() {
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let connection = client.get_async_connection().await.expect("cluster connection");
    let store = RedisStore::new(connection, unique("group")).with_batching(Batching::new(64, true));
    // Keys spread over the three masters: a batch of mixed tags would fail with CROSSSLOT.
    let events: Vec<(String, String)> = (0..600).map(|i| (format!("user-{}", i % 30), format!("m{i}"))).collect();

    let answers = concurrently(&store, "cluster", &events).await;

    for key in ["user-0", "user-13", "user-29"] {
        assert_eq!(slots_of(&events, &answers, key), model_slots("cluster", &events, key).await, "{key}");
    }
}

#[tokio::test]
async fn the_dispatchers_marker_operations_share_calls_and_keep_their_meaning() {
    use drip_store::{DispatchClaim, MessageOf};
    let calls = Arc::new(AtomicUsize::new(0));
    let connection = Counting::new(shared_connection().await, calls.clone());
    let store = RedisStore::new(connection, unique("group")).with_batching(Batching::new(64, false));
    let ids: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    let claims =
        join_all(ids.iter().map(|id| store.claim_dispatch(MessageOf { rule: "rule", key: "k", message: id }, 5_000)))
            .await;
    assert!(claims.iter().all(|c| matches!(c, Ok(DispatchClaim::Acquired))), "{claims:?}");
    let taken = calls.swap(0, Ordering::Relaxed);
    assert!(taken <= 200 / 8, "200 concurrent claims took {taken} calls: not batched");

    // The same message twice in one batch: the first takes it, the second finds it held.
    let twice = join_all(
        ["again", "again"].map(|id| store.claim_dispatch(MessageOf { rule: "rule", key: "k", message: id }, 5_000)),
    )
    .await;
    let twice: Vec<DispatchClaim> = twice.into_iter().map(Result::unwrap).collect();
    assert!(twice.contains(&DispatchClaim::Acquired) && twice.contains(&DispatchClaim::Busy), "{twice:?}");

    let finishes =
        join_all(ids.iter().map(|id| store.finish_dispatch(MessageOf { rule: "rule", key: "k", message: id }, 60_000)))
            .await;
    assert!(finishes.iter().all(Result::is_ok));
    let again = store.claim_dispatch(MessageOf { rule: "rule", key: "k", message: "m7" }, 5_000).await.unwrap();
    assert_eq!(again, DispatchClaim::Done, "a finished message is never claimed again");
    store.release_dispatch(MessageOf { rule: "rule", key: "k", message: "again" }).await.unwrap();
    let released = store.claim_dispatch(MessageOf { rule: "rule", key: "k", message: "again" }, 5_000).await.unwrap();
    assert_eq!(released, DispatchClaim::Acquired, "a released claim can be taken at once");
}

/// 32 events of `rule` over two keys, drawing from `budgets`, reserved at once: each gets a slot.
async fn reserve_at_once<C>(store: &RedisStore<C>, rule: &str, budgets: &[Arc<drip_core::budgets::Budget>])
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let limits = limits();
    let ids: Vec<String> = (0..32).map(|i| format!("m{i}")).collect();
    let tag = budgets.first().map(|b| b.tag.as_str());
    let requests: Vec<SlotRequest> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let event = ReserveRequest { budgets, ..request(rule, "", id, &limits).event };
            SlotRequest { tag, ..SlotRequest::new(rule, ["k1", "k2"][i % 2], event) }.at(T0)
        })
        .collect();
    let answers = join_all(requests.iter().map(|r| store.reserve(r))).await;
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|r| r.reservation.slot >= T0)), "{answers:?}");
}

/// A lane of a leased budget's partition has one call in flight at a time (calls in flight
/// together would find its pool empty together, and each stop for the same lease), while another
/// lane has up to four. (On one Redis every event is on one lane, but for this.)
#[tokio::test]
async fn a_leased_lane_has_one_call_in_flight_and_another_lane_four() {
    use drip_core::budgets::{Budget, Leases};
    let overlap = Overlap::default();
    let connection =
        Counting { overlap: Some(overlap.clone()), ..Counting::new(shared_connection().await, Arc::default()) };
    let most = overlap.most;
    // Two events a call, so that 32 at once need 16 calls.
    let store = RedisStore::new(connection, unique("group")).with_batching(Batching::new(2, false));

    reserve_at_once(&store, &unique("unleased"), &[]).await;
    assert!(most.swap(0, Ordering::SeqCst) >= 2, "unleased calls overlap (up to four in flight)");

    let rule = unique("leased");
    let limit = Limit::new(1_000, SECOND, Window::Fixed(Placement::Start)).unwrap();
    let budget = Arc::new(Budget {
        leases: Some(Leases { partitions: 2, chunk: Leases::default_chunk(2) }),
        ..Budget::named(format!("{rule}-b"), format!("{rule}-b"), vec![limit])
    });
    reserve_at_once(&store, &rule, &[budget]).await;
    assert_eq!(most.load(Ordering::SeqCst), 1, "a leased lane's calls go one at a time");
}
