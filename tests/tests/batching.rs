//! Batching through the real local stack (Redis, the Pub/Sub emulator, the Cloud Tasks stand-in
//! and both services): a burst's delayed events share Cloud Tasks, each still reaches its topic
//! once and at its slot, and a batched create that timed out after it took effect doubles nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use base64::Engine;
use cloud_tasks_emulator::{Fault, Faults, TaskSnapshot};
use drip_core::time::{Millis, SECOND, format_rfc3339, parse_rfc3339, wall_clock_millis};
use drip_tests::pubsub_emulator::{Pubsub, Pulled};
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{LimiterUnderTest, LimiterWiring, TasksStandIn, spawn_dispatcher, spawn_limiter};
use drip_tests::{push_envelope, unique};
use reqwest::StatusCode;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-burst
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 5, per: 1s }]
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
  - name: {p}-inline
    match: { attributes: { event_type: inline } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 1, per: 1s, window: gcra }]
    max_delay: 5m
    inline_wait: 2s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
"#;

struct Stack {
    prefix: String,
    pubsub: Pubsub,
    tasks: TasksStandIn,
    limiter: LimiterUnderTest,
    http: reqwest::Client,
}

async fn stack(timeouts_ms: u64) -> Stack {
    stack_lingering(timeouts_ms, 0).await
}

async fn stack_lingering(timeouts_ms: u64, task_linger_ms: u64) -> Stack {
    let prefix = unique("batch");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = RULES.replace("{p}", &prefix);
    let namespace = unique("drip");
    let dispatcher = spawn_dispatcher(&rules, &shared_url(), &namespace, &pubsub.host, None).await;
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 1);
    let mut wiring =
        LimiterWiring::new(shared_url(), pubsub.host.clone(), &tasks, queues, format!("{}/dispatch", dispatcher.url));
    wiring.namespace = namespace;
    wiring.timeouts_ms = timeouts_ms;
    wiring.task_linger_ms = task_linger_ms;
    let limiter = spawn_limiter(&rules, &wiring).await;
    Stack { prefix, pubsub, tasks, limiter, http: reqwest::Client::new() }
}

impl Stack {
    /// Pushes every message at once, each retried as Pub/Sub would until it is acked.
    async fn push_all(&self, ids: &[String], published: &str) {
        self.push_all_of("payout", ids, published).await
    }

    async fn push_all_of(&self, event_type: &str, ids: &[String], published: &str) {
        let pushes = ids.iter().map(|id| {
            let body = push_envelope(
                id,
                "projects/p/subscriptions/source",
                published,
                &[("event_type", event_type)],
                br#"{"merchant":1}"#,
            );
            let (http, url) = (self.http.clone(), format!("{}/push", self.limiter.url));
            async move {
                loop {
                    let status = http.post(&url).body(body.clone()).send().await.unwrap().status();
                    if status == StatusCode::NO_CONTENT {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        futures_util::future::join_all(pushes).await;
    }

    /// The messages the tasks created so far carry (those delayed).
    async fn in_tasks(&self) -> std::collections::HashSet<String> {
        let tasks = self.tasks.client.tasks().await.unwrap();
        carried(&tasks).into_iter().flat_map(|(_, events)| events).collect()
    }

    /// Every message on the forward and overflow topics, read until `count` distinct ones came
    /// and then a second more (a duplicate would show then).
    async fn delivered(&self, count: usize, timeout: Duration) -> Vec<Pulled> {
        let deadline = std::time::Instant::now() + timeout;
        let mut all: Vec<Pulled> = Vec::new();
        let mut settled_at = None;
        loop {
            for topic in ["ready", "overflow"] {
                all.extend(self.pubsub.pull(&format!("{}-{topic}", self.prefix), 1_000).await);
            }
            let distinct: std::collections::HashSet<&String> =
                all.iter().map(|m| &m.attributes["drip-message-id"]).collect();
            if distinct.len() >= count && settled_at.is_none() {
                settled_at = Some(std::time::Instant::now());
            }
            if settled_at.is_some_and(|at| at.elapsed() > Duration::from_secs(1)) {
                return all;
            }
            assert!(std::time::Instant::now() < deadline, "only {} of {count} messages came out", distinct.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The events each task carries, by message id.
fn carried(tasks: &[TaskSnapshot]) -> Vec<(String, Vec<String>)> {
    tasks
        .iter()
        .map(|task| {
            let body: serde_json::Value =
                serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(&task.body).unwrap()).unwrap();
            let events = match body.get("batch").and_then(|b| b.as_array()) {
                Some(batch) => batch.iter().map(|e| e["messageId"].as_str().unwrap().to_owned()).collect(),
                None => vec![body["messageId"].as_str().unwrap().to_owned()],
            };
            (task.name.clone(), events)
        })
        .collect()
}

fn count_by_id(messages: &[Pulled]) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for message in messages {
        *counts.entry(message.attributes["drip-message-id"].as_str()).or_default() += 1;
    }
    counts
}

/// Per one-second window of the publish times: the most any window saw.
fn fullest_second(messages: &[Pulled]) -> usize {
    let mut per_second: BTreeMap<Millis, usize> = BTreeMap::new();
    for message in messages {
        *per_second.entry(parse_rfc3339(&message.publish_time).unwrap() / SECOND).or_default() += 1;
    }
    per_second.values().copied().max().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_keys_burst_travels_in_shared_tasks_and_each_event_comes_out_once_at_its_slot() {
    let s = stack(3_000).await;
    let ids: Vec<String> = (0..40).map(|i| format!("{}-{i}", s.prefix)).collect();
    s.push_all(&ids, &format_rfc3339(wall_clock_millis())).await;

    let tasks = s.tasks.client.tasks().await.unwrap();
    let carried = carried(&tasks);
    let delayed: usize = carried.iter().map(|(_, events)| events.len()).sum();
    let batches = carried.iter().filter(|(_, events)| events.len() > 1).count();
    eprintln!("40 pushes at once, 5/s: {delayed} delayed events in {} tasks ({batches} batches)", tasks.len());
    assert!(batches > 0 && tasks.len() < delayed, "delayed events share tasks: {carried:?}");

    let delivered = s.delivered(ids.len(), Duration::from_secs(30)).await;
    let counts = count_by_id(&delivered);
    assert_eq!(counts.len(), ids.len(), "every message came out");
    assert!(counts.values().all(|&n| n == 1), "none twice: {counts:?}");
    for message in &delivered {
        let slot = parse_rfc3339(&message.attributes["drip-scheduled-for"]).unwrap();
        let published = parse_rfc3339(&message.publish_time).unwrap();
        assert!(published >= slot - 5, "published at {published}, before its slot {slot}");
    }
    let fullest = fullest_second(&delivered);
    assert!(fullest <= 5, "the topics saw {fullest} in one second of one merchant at 5/s");
}

/// A delayed event's create lingers (here up to 3 s) only while a push still in flight may join
/// it: a lone delayed push is answered at once, and one pushed while another push waits in
/// process for its slot (`inline_wait`) is answered once that push is done, not after 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_lingers_only_while_a_push_in_flight_may_still_join_it() {
    let s = stack_lingering(3_000, 3_000).await;
    let now = format_rfc3339(wall_clock_millis());
    let ids: Vec<String> = (0..17).map(|i| format!("{}-{i}", s.prefix)).collect();
    // Ten at once fill two windows of 5/s (whichever second they fall in), so the eleventh is
    // delayed, alone in flight.
    s.push_all(&ids[..10], &now).await;
    let started = std::time::Instant::now();
    s.push_all(&ids[10..11], &now).await;
    let alone = started.elapsed();
    assert!(s.in_tasks().await.contains(&ids[10]), "the lone push was delayed");
    assert!(alone < Duration::from_millis(1_500), "a lone delayed push waited {alone:?} for others to join");

    // An inline event of 1/s: the first goes now, the second waits in process for its slot, a
    // second away; meanwhile six payouts (more than a window holds: some are delayed) wait for it
    // (it may still join their creates), and go once it is done.
    let inline: Vec<String> = (0..2).map(|i| format!("{}-inline-{i}", s.prefix)).collect();
    s.push_all_of("inline", &inline[..1], &now).await;
    let started = std::time::Instant::now();
    let (_, waited) = tokio::join!(s.push_all_of("inline", &inline[1..], &now), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.push_all(&ids[11..], &now).await;
        started.elapsed()
    });
    let inline_done = started.elapsed();
    let in_tasks = s.in_tasks().await;
    let delayed = ids[11..].iter().filter(|id| in_tasks.contains(*id)).count();
    assert!(delayed > 0, "some of the six were delayed");
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_millis(2_500),
        "the delayed pushes were answered after {waited:?}: they should wait for the inline push (done after {inline_done:?}), not the whole 3 s"
    );
    let delivered = s.delivered(ids.len() + inline.len(), Duration::from_secs(30)).await;
    let counts = count_by_id(&delivered);
    assert!(counts.len() == ids.len() + inline.len() && counts.values().all(|&n| n == 1), "each once: {counts:?}");
}

/// The stand-in creates each task and never answers: every create times out after it took effect,
/// and the pushes are retried until Cloud Tasks answers again, regrouped into other tasks. Every
/// message still comes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_create_that_timed_out_after_it_took_effect_doubles_no_event() {
    let s = stack(800).await;
    let ids: Vec<String> = (0..20).map(|i| format!("{}-{i}", s.prefix)).collect();
    let published = format_rfc3339(wall_clock_millis());
    s.tasks.client.set_faults(Faults { create_task: Fault::AcceptThenHang }).await.unwrap();
    let healing = async {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        s.tasks.client.set_faults(Faults::default()).await.unwrap();
    };
    tokio::join!(s.push_all(&ids, &published), healing);

    let carried = carried(&s.tasks.client.tasks().await.unwrap());
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for (_, events) in &carried {
        for id in events {
            *copies.entry(id.as_str()).or_default() += 1;
        }
    }
    assert!(copies.values().any(|&n| n > 1), "some event travels in two tasks: {carried:?}");

    let delivered = s.delivered(ids.len(), Duration::from_secs(40)).await;
    let counts = count_by_id(&delivered);
    assert_eq!(counts.len(), ids.len(), "every message came out");
    assert!(counts.values().all(|&n| n == 1), "none twice: {counts:?}");
}

/// The real publisher under a counter: how many requests `BatchedPublishes` made of its messages.
#[derive(Debug)]
struct Counting {
    inner: drip_gcp::pubsub::Publishers,
    requests: std::sync::atomic::AtomicUsize,
}

impl drip_gcp::Publish for Counting {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> drip_gcp::GcpFuture<'a, String, drip_gcp::pubsub::PublishError> {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(self.inner.publish(topic, data, attributes))
    }

    fn publish_all<'a>(
        &'a self,
        topic: &'a str,
        messages: Vec<drip_gcp::pubsub::Outgoing>,
    ) -> drip_gcp::pubsub::PublishAllFuture<'a> {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(self.inner.publish_all(topic, messages))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_that_arrive_together_share_requests_and_each_arrives_once() {
    let pubsub = Pubsub::shared();
    let topic = unique("batched-publishes");
    pubsub.topic_with_subscription(&topic).await;
    let publishers = drip_gcp::pubsub::Publishers::connect(
        drip_tests::pubsub_emulator::PROJECT,
        Some(&pubsub.host),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let counting = std::sync::Arc::new(Counting { inner: publishers, requests: Default::default() });
    let batched = drip_gcp::pubsub::BatchedPublishes::new(counting.clone(), 100);
    let sends = (0..300).map(|i| {
        let attributes = BTreeMap::from([("drip-message-id".to_owned(), format!("m{i}"))]);
        drip_gcp::Publish::publish(&batched, &topic, format!("{i}").into_bytes(), attributes)
    });
    let ids = futures_util::future::join_all(sends).await;
    assert!(ids.iter().all(Result::is_ok), "{ids:?}");

    let requests = counting.requests.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("300 concurrent publishes: {requests} calls of the client");
    assert!(requests <= 300 / 4, "300 publishes took {requests} requests: not batched");
    let pulled = pubsub.pull_until(&topic, 300, Duration::from_secs(20)).await;
    let counts = count_by_id(&pulled);
    assert_eq!(counts.len(), 300);
    assert!(counts.values().all(|&n| n == 1), "none twice");
}
