//! The dispatcher's app driven in process with `tower::ServiceExt::oneshot`: the reference model
//! (`MemoryStore`) as the store and a recording double for Pub/Sub. Milliseconds per case, no
//! services; what only the real parts show (Cloud Tasks' retries, Redis, the emulator) stays in
//! `tests/tests/dispatcher.rs` and the end-to-end tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use drip_core::budgets::{Budget, FairRing};
use drip_core::event::MessageRef;
use drip_core::overflow::{
    FairWakeTask, RateLimitMeta, SIGNATURE_HEADER, TaskBatch, TaskBody, TaskPayload, TaskSeal, TaskSigner, WakeOf,
    WakeTask,
};
use drip_core::rules::{Rule, RuleSet, ServiceRules};
use drip_core::schedule::{Attempt, Status, Unpark};
use drip_core::time::{HOUR, Millis, SECOND, wall_clock_millis};
use drip_dispatcher::{AppState, app};
use drip_gcp::doubles::{RecordingPublisher, RecordingTasks};
use drip_gcp::http_target::{HttpTarget, IdTokenMode};
use drip_service::auth::RouteAuth;
use drip_service::metrics::ServiceMetrics;
use drip_service::task_batches::{TaskBatcher, TaskBatching};
use drip_service::tasks::Tasks;
use drip_store::{MemoryStore, MessageOf, SlotRequest, Store};
use tower::ServiceExt;

const KEY: &str = "a-signing-key-of-at-least-32-characters";
const TASK_NAME: &str = "projects/p/locations/l/queues/q/tasks/t1";

const RULES: &str = r#"
default_dlq_topic: drip-dlq
rules:
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{attributes.merchant}"
    limits: [ { limit: 1, per: 1s } ]
    max_delay: 1h
    park_horizon: off
    forward: { topic: payouts-ready }
    overflow_topic: payouts-overflow
"#;

struct Dispatcher {
    state: AppState,
    pubsub: Arc<RecordingPublisher>,
    store: Arc<MemoryStore>,
    tasks: Arc<RecordingTasks>,
}

fn dispatcher() -> Dispatcher {
    dispatcher_with(RULES)
}

fn dispatcher_with(rules: &str) -> Dispatcher {
    dispatcher_on(rules, Arc::new(MemoryStore::new()))
}

/// A dispatcher of these rules on `store` (another dispatcher's, to see a rules change).
fn dispatcher_on(rules: &str, store: Arc<MemoryStore>) -> Dispatcher {
    let rules = ServiceRules::new(RuleSet::parse("handlers.yaml", rules).unwrap(), "handlers.yaml").unwrap();
    let metrics = Arc::new(ServiceMetrics::new(("dispatches", "-"), ("dispatch_lateness_seconds", "-")));
    let pubsub = Arc::new(RecordingPublisher::default());
    let tasks = Arc::new(RecordingTasks::default());
    let state = AppState {
        rules: drip_service::live_rules::LiveRules::fixed(rules, metrics.shared.clone()),
        store: store.clone(),
        publishers: pubsub.clone(),
        auth: (RouteAuth::off(), RouteAuth::off()),
        metrics,
        signer: TaskSigner::new(KEY),
        max_attempts: 100,
        lease: 10_000,
        target: Arc::new(HttpTarget::new(Duration::from_secs(1), IdTokenMode::Never).unwrap()),
        latency: Arc::default(),
        tasks: Some(TaskBatcher::new(
            Tasks::new(tasks.clone(), vec!["q".into()], TaskSigner::new(KEY)),
            TaskBatching { max_events: 500, bucket: 1_000, in_flight: 1, linger: 0 },
        )),
        early_tolerance: SECOND,
        accept_unsigned_until: None,
    };
    Dispatcher { state, pubsub, store, tasks }
}

/// The body of a task for message `id`, due at `slot`, carrying `amount`.
fn task(id: &str, slot: Millis, amount: u64) -> Vec<u8> {
    let payload = TaskPayload::inline(format!(r#"{{"amount":{amount}}}"#).as_bytes());
    event(id, "merchant_7", slot, payload, BTreeMap::from([("event_type".into(), "payout".into())]))
}

const SUBSCRIPTION: &str = "projects/p/subscriptions/source";

fn event(id: &str, key: &str, slot: Millis, payload: TaskPayload, attributes: BTreeMap<String, String>) -> Vec<u8> {
    let body = TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: key.into(),
            rule: "payouts".into(),
            rule_id: None,
            window_type: "RPS".into(),
            limit: 1,
            scheduled_for: slot,
            overflow_topic: "payouts-overflow".into(),
            cost: None,
        },
        payload,
        attributes,
        message_id: id.into(),
        subscription: Some(SUBSCRIPTION.into()),
        publish_time: None,
    };
    serde_json::to_vec(&body).unwrap()
}

/// A batch task of `events`, sealed at the first one's slot.
fn batch(events: &[Vec<u8>], first: Millis) -> (Vec<u8>, String) {
    let body = TaskBatch::encode(&events.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let sealed = seal(&body, first, TASK_NAME);
    (body, sealed)
}

fn seal(body: &[u8], slot: Millis, name: &str) -> String {
    TaskSigner::new(KEY).sign(&TaskSeal { name, slot, expires: slot + HOUR }, body)
}

impl Dispatcher {
    async fn run(&self, body: &[u8], seal: Option<&str>) -> StatusCode {
        let mut request = Request::post("/dispatch")
            .header("X-CloudTasks-QueueName", "q")
            .header("X-CloudTasks-TaskName", TASK_NAME)
            .header("X-CloudTasks-TaskRetryCount", "0");
        if let Some(seal) = seal {
            request = request.header(SIGNATURE_HEADER, seal);
        }
        let request = request.body(Body::from(body.to_vec())).unwrap();
        app(self.state.clone()).oneshot(request).await.unwrap().status()
    }

    /// (topic, drip-message-id, when) of each publish.
    fn published_ids(&self) -> Vec<(String, String, Millis)> {
        let published = self.pubsub.published.lock().unwrap();
        published.iter().map(|p| (p.topic.clone(), p.attributes["drip-message-id"].clone(), p.at)).collect()
    }

    fn published(&self) -> Vec<(String, String)> {
        let published = self.pubsub.published.lock().unwrap();
        published.iter().map(|p| (p.topic.clone(), String::from_utf8_lossy(&p.data).into_owned())).collect()
    }
}

/// Waits until the wall clock is 100-300 ms into a second: a slot a few ms back then stays in the
/// current 1 s window while the test runs (a task for an earlier window is late, and re-slotted).
async fn early_in_a_second() {
    while !(100..300).contains(&(wall_clock_millis() % 1_000)) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Only the limiter's sealed task is published, at its slot and once: a forged amount, an unsealed
/// copy, another task's name and an early run are refused or retried, a replay is a duplicate.
#[tokio::test]
async fn only_the_sealed_task_is_published_and_only_once() {
    let d = dispatcher();
    let slot = wall_clock_millis() - 100;
    let real = task("m1", slot, 100);
    let sealed = seal(&real, slot, TASK_NAME);

    assert_eq!(d.run(&task("m1", slot, 9_999), Some(&sealed)).await, StatusCode::FORBIDDEN, "a forged amount");
    assert_eq!(d.run(&real, None).await, StatusCode::FORBIDDEN, "unsealed");
    let elsewhere = seal(&real, slot, "projects/p/locations/l/queues/q/tasks/other");
    assert_eq!(d.run(&real, Some(&elsewhere)).await, StatusCode::FORBIDDEN, "sealed for another task name");
    let later = wall_clock_millis() + 6 * SECOND;
    let early = task("m2", later, 5);
    let early_seal = seal(&early, later, TASK_NAME);
    assert_eq!(d.run(&early, Some(&early_seal)).await, StatusCode::SERVICE_UNAVAILABLE, "6 s early");
    assert!(d.published().is_empty(), "nothing published: {:?}", d.published());
    let metrics = d.state.metrics.shared.render();
    for (outcome, count) in [("not_a_task", 3), ("early", 1)] {
        let line = format!(r#"drip_dispatches_total{{rule="-",outcome="{outcome}"}} {count}"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }

    assert_eq!(d.run(&real, Some(&sealed)).await, StatusCode::OK);
    let published = d.published();
    assert_eq!(published.len(), 1, "{published:?}");
    let message: serde_json::Value = serde_json::from_str(&published[0].1).unwrap();
    assert_eq!((published[0].0.as_str(), &message["originalPayload"]["amount"]), ("payouts-overflow", &100.into()));
    assert_eq!(d.run(&real, Some(&sealed)).await, StatusCode::OK, "a replay is acked");
    assert_eq!(d.published().len(), 1, "and not published again");
}

/// A task whose seal expired (its queue's retry span is over) is refused, never published.
#[tokio::test]
async fn an_expired_seal_is_refused() {
    let d = dispatcher();
    let slot = wall_clock_millis() - 2 * HOUR;
    let old = task("m3", slot, 1);
    assert_eq!(d.run(&old, Some(&seal(&old, slot, TASK_NAME))).await, StatusCode::FORBIDDEN);
    assert!(d.published().is_empty());
}

/// A batch task: each event at its own slot; Pub/Sub failing for two of four is a 503 and the retry
/// publishes only those two; a replay publishes nothing.
#[tokio::test]
async fn a_batch_publishes_each_event_at_its_slot_and_a_retry_only_the_rest() {
    let d = dispatcher();
    early_in_a_second().await;
    let now = wall_clock_millis();
    let slots = [now - 50, now + 200, now + 400, now + 600];
    let events: Vec<Vec<u8>> =
        slots.iter().enumerate().map(|(i, &slot)| task(&format!("b{i}"), slot, i as u64)).collect();
    let (body, sealed) = batch(&events, slots[0]);
    d.pubsub.fail_once.lock().unwrap().extend(["b1".to_owned(), "b3".to_owned()]);

    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::SERVICE_UNAVAILABLE, "two events not on a topic");
    let first: Vec<String> = d.published_ids().into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(first, ["b0", "b2"]);
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK, "a replay is acked");

    let published = d.published_ids();
    let mut ids: Vec<&str> = published.iter().map(|(_, id, _)| id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["b0", "b1", "b2", "b3"], "each event once");
    for (topic, id, at) in &published {
        let slot = slots[id[1..].parse::<usize>().unwrap()];
        assert_eq!(topic, "payouts-overflow");
        assert!(*at >= slot, "{id} published at {at}, before its slot {slot}");
    } // Each event of each attempt counted once, as it ended.
    let metrics = d.state.metrics.shared.render();
    for (outcome, count) in [("published", 4), ("retry", 2), ("duplicate", 6)] {
        let line = format!(r#"drip_dispatches_total{{rule="payouts",outcome="{outcome}"}} {count}"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}

/// Beside ordinary events, a paused key's event gets a new task after the pause, a claim-checked
/// payload is fetched, and an event with more attributes than Pub/Sub takes is dead-lettered: each
/// as it would be alone, and the batch is done.
#[tokio::test]
async fn a_batch_handles_each_event_as_it_would_be_alone() {
    let d = dispatcher();
    early_in_a_second().await;
    let now = wall_clock_millis() - 10;
    let rules = d.state.rules.current();
    let rule = &rules.rules[0];
    let payout = || BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let identity = MessageRef::new("c1".to_owned(), Some(SUBSCRIPTION.to_owned())).identity();
    let of = MessageOf { rule: &rule.id, key: "merchant_7", message: &identity };
    let reference = Store::put_payload(&*d.store, of, br#"{"amount":42}"#, HOUR).await.unwrap();
    let paused_until = wall_clock_millis() + 5 * SECOND;
    Store::pause(&*d.store, rule, "merchant_9", paused_until).await.unwrap();
    let crowded: BTreeMap<String, String> = (0..120).map(|i| (format!("a{i}"), "x".to_owned())).collect();
    let events = [
        task("o1", now, 1),
        event("c1", "merchant_7", now, TaskPayload::ClaimCheck(reference), payout()),
        event("t1", "merchant_8", now, TaskPayload::inline(b"{}"), crowded),
        event("p1", "merchant_9", now, TaskPayload::inline(b"{}"), payout()),
    ];
    let (body, sealed) = batch(&events, now);

    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);

    let published = d.published();
    let on =
        |topic: &str| published.iter().filter(|(t, _)| t == topic).map(|(_, data)| data.clone()).collect::<Vec<_>>();
    let overflow = on("payouts-overflow");
    assert_eq!(overflow.len(), 2, "{published:?}");
    assert!(overflow.iter().any(|m| m.contains(r#""amount":42"#)), "the claim-checked payload: {overflow:?}");
    assert_eq!(on("drip-dlq").len(), 1, "the crowded event alone: {published:?}");
    let tasks = d.tasks.created.lock().unwrap().clone();
    assert_eq!(tasks.len(), 1, "the paused key's event has a new task");
    let moved: serde_json::Value = serde_json::from_slice(&tasks[0].body).unwrap();
    assert_eq!(moved["messageId"], "p1");
    assert!(tasks[0].at >= paused_until, "its new slot is after the pause");
}

/// The dispatcher's reschedules go through the same task batcher as the limiter's delayed events:
/// events of a paused key whose tasks run together get new slots in one bucket, and those that
/// arrive while a create is in flight share the next task (the first goes alone, at once).
#[tokio::test]
async fn rescheduled_events_of_one_bucket_share_one_task() {
    let d = dispatcher();
    let now = wall_clock_millis();
    let until = (now + 10 * 60 * SECOND).div_euclid(SECOND) * SECOND;
    let rule = d.state.rules.current().rules[0].clone();
    let keys = ["merchant_a", "merchant_b", "merchant_c"];
    for key in keys {
        Store::pause(&*d.store, &rule, key, until).await.unwrap();
    }
    *d.tasks.latency.lock().unwrap() = Duration::from_millis(50);
    let payout = || BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let runs = keys.map(|key| {
        let body = event(&format!("r-{key}"), key, now, TaskPayload::inline(b"{}"), payout());
        let sealed = seal(&body, now, TASK_NAME);
        (body, sealed)
    });
    let (a, b, c) = tokio::join!(
        d.run(&runs[0].0, Some(&runs[0].1)),
        d.run(&runs[1].0, Some(&runs[1].1)),
        d.run(&runs[2].0, Some(&runs[2].1))
    );
    assert_eq!((a, b, c), (StatusCode::OK, StatusCode::OK, StatusCode::OK));
    let tasks = d.tasks.created.lock().unwrap().clone();
    assert_eq!(tasks.len(), 2, "one alone, then one carrying the two that waited: {tasks:?}");
    let shared = TaskBatch::parse(&tasks[1].body).expect("a batch body");
    assert_eq!(shared.batch.len(), 2);
    assert!(tasks.iter().all(|t| t.at == until), "every new slot is the pauses' end");
}

/// A batch came only after seals: an unsealed one is refused even while unsigned tasks are accepted.
#[tokio::test]
async fn an_unsealed_batch_is_refused() {
    let mut d = dispatcher();
    d.state.accept_unsigned_until = Some(wall_clock_millis() + HOUR);
    let now = wall_clock_millis();
    let (body, _) = batch(&[task("u1", now, 1), task("u2", now, 2)], now);
    assert_eq!(d.run(&body, None).await, StatusCode::FORBIDDEN);
    assert!(d.published().is_empty());
}

/// A rule whose overflow goes to an HTTP target that takes one event per request: a batch task's
/// events are POSTed one per request, each at its own slot, and the batch is done once all are.
#[tokio::test]
async fn a_batch_for_an_overflow_url_posts_each_event_alone_at_its_slot() {
    let posted: Arc<std::sync::Mutex<Vec<(String, Millis)>>> = Arc::default();
    let log = posted.clone();
    let target = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let log = log.clone();
        async move {
            let id = headers.get("x-drip-message-id").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
            log.lock().unwrap().push((id, wall_clock_millis()));
            StatusCode::NO_CONTENT
        }
    });
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, target).await });
    let mut d = dispatcher();
    let rules = format!("{RULES}    overflow: {{ url: \"{url}\" }}\n");
    let rules = ServiceRules::new(RuleSet::parse("handlers.yaml", &rules).unwrap(), "handlers.yaml").unwrap();
    d.state.rules = drip_service::live_rules::LiveRules::fixed(rules, d.state.metrics.shared.clone());
    let now = wall_clock_millis();
    let slots = [now - 20, now + 150, now + 300];
    let events: Vec<Vec<u8>> = slots.iter().enumerate().map(|(i, &slot)| task(&format!("h{i}"), slot, 1)).collect();
    let (body, sealed) = batch(&events, slots[0]);

    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);

    let mut posted = posted.lock().unwrap().clone();
    posted.sort();
    assert_eq!(posted.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["h0", "h1", "h2"], "one request each");
    for ((_, at), slot) in posted.iter().zip(slots) {
        assert!(*at >= slot, "posted at {at}, before its slot {slot}");
    }
    assert!(d.published().is_empty(), "nothing on the overflow topic: the URL took them");
}

/// Reserves message `id` of `key` at `at`, as the limiter did when it made the message's task.
async fn reserve_at(d: &Dispatcher, key: &str, id: &str, at: Millis) -> Millis {
    let rule = d.state.rules.current().rules[0].clone();
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let identity = MessageRef::new(id.to_owned(), Some(SUBSCRIPTION.to_owned())).identity_with(&attributes);
    let request = drip_store::SlotRequest::for_rule(&rule, key, &identity, 1).at(at);
    Store::reserve(&*d.store, &request).await.unwrap().reservation.slot
}

/// A task that comes in a later window than its slot's (created or retried late) takes the
/// earliest slot that fits now, its old one given back: a task of its own when the current
/// window is full, published at once when it has room. `late_events: deliver` publishes at once.
#[tokio::test]
async fn a_late_task_waits_its_turn_unless_its_window_has_room() {
    let d = dispatcher();
    let now = wall_clock_millis();
    let past = (now - 5 * SECOND).div_euclid(SECOND) * SECOND;
    let payout = || BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    // merchant_7's window now is taken by an event that owns it; merchant_9's is free.
    assert_eq!(reserve_at(&d, "merchant_7", "late-7", past).await, past);
    reserve_at(&d, "merchant_7", "owner", now).await;
    assert_eq!(reserve_at(&d, "merchant_9", "late-9", past).await, past);
    for (id, key) in [("late-7", "merchant_7"), ("late-9", "merchant_9")] {
        let body = event(id, key, past, TaskPayload::inline(b"{}"), payout());
        assert_eq!(d.run(&body, Some(&seal(&body, past, TASK_NAME))).await, StatusCode::OK);
    }
    let published: Vec<String> = d.published_ids().into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(published, ["late-9"], "the key with room now publishes at once");
    let tasks = d.tasks.created.lock().unwrap().clone();
    assert_eq!(tasks.len(), 1, "the other waits for the window after the one its owner holds: {tasks:?}");
    assert!(tasks[0].at > now.div_euclid(SECOND) * SECOND && tasks[0].at <= now + 2 * SECOND, "{tasks:?}");

    let d = dispatcher_with(
        &RULES
            .replace("overflow_topic: payouts-overflow", "overflow_topic: payouts-overflow\n    late_events: deliver"),
    );
    assert_eq!(reserve_at(&d, "merchant_7", "late-7", past).await, past);
    reserve_at(&d, "merchant_7", "owner", now).await;
    let body = event("late-7", "merchant_7", past, TaskPayload::inline(b"{}"), payout());
    assert_eq!(d.run(&body, Some(&seal(&body, past, TASK_NAME))).await, StatusCode::OK);
    assert_eq!(d.published_ids().len(), 1, "late_events: deliver publishes at once");
    assert!(d.tasks.created.lock().unwrap().is_empty());
}

/// A task that finds its key paused was never delivered: its slot's units go back as it takes
/// the slot after the pause. Two payouts an hour, both reserved, then a pause: the first's task
/// gets the slot at the pause's end in the same hour; were its old slot kept, the hour would be
/// full and it would be dead-lettered past max_delay.
#[tokio::test]
async fn a_task_that_finds_a_pause_gives_its_slot_back() {
    let hourly = RULES.replace("limits: [ { limit: 1, per: 1s } ]", "limits: [ { limit: 2, per: 1h } ]");
    let d = dispatcher_with(&hourly);
    let now = wall_clock_millis();
    let hour_end = (now / HOUR + 1) * HOUR;
    let until = (now + SECOND).min(hour_end - 1);
    assert_eq!(reserve_at(&d, "merchant_7", "first", now).await, now);
    assert_eq!(reserve_at(&d, "merchant_7", "second", now).await, now);
    let rule = d.state.rules.current().rules[0].clone();
    Store::pause(&*d.store, &rule, "merchant_7", until).await.unwrap();
    let payout = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let body = event("first", "merchant_7", now, TaskPayload::inline(b"{}"), payout);
    assert_eq!(d.run(&body, Some(&seal(&body, now, TASK_NAME))).await, StatusCode::OK);
    assert!(d.published_ids().is_empty(), "nothing published during the pause, nothing dead-lettered");
    let tasks = d.tasks.created.lock().unwrap().clone();
    assert_eq!(tasks.iter().map(|t| t.at).collect::<Vec<_>>(), [until], "the slot at the pause's end");
    let state = d.store.entity_state(&rule.id, "merchant_7").unwrap();
    let hour = drip_core::schedule::LimitState::Fixed { window: now / HOUR * HOUR, used: 2 };
    assert_eq!(state.limits.values().collect::<Vec<_>>(), [&hour], "two units in the hour, not three");
}

/// A pause that outlasts `max_delay` leaves the event no slot: it is dead-lettered, through the
/// dispatcher's one dead-letter path, with its data, the reason, and the task that carried it; no
/// new task is made and nothing reaches the overflow topic.
#[tokio::test]
async fn a_task_whose_pause_outlasts_max_delay_is_dead_lettered_with_its_data() {
    let d = dispatcher();
    let now = wall_clock_millis();
    assert_eq!(reserve_at(&d, "merchant_7", "first", now).await, now);
    let rule = d.state.rules.current().rules[0].clone();
    Store::pause(&*d.store, &rule, "merchant_7", now + 2 * HOUR).await.unwrap();
    let body = task("first", now, 42);
    assert_eq!(d.run(&body, Some(&seal(&body, now, TASK_NAME))).await, StatusCode::OK);
    let published = d.pubsub.published.lock().unwrap().clone();
    assert_eq!(published.len(), 1, "one message: the dead letter");
    let letter = &published[0];
    assert_eq!(letter.topic, "drip-dlq");
    assert_eq!(String::from_utf8_lossy(&letter.data), r#"{"amount":42}"#);
    assert_eq!(letter.attributes["drip-reason"], "max_delay_exceeded");
    assert_eq!(letter.attributes["drip-task"], TASK_NAME);
    assert!(letter.attributes["drip-detail"].starts_with("paused until"), "{:?}", letter.attributes);
    assert!(d.tasks.created.lock().unwrap().is_empty(), "no task for a slot past max_delay");
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let identity = MessageRef::new("first".to_owned(), Some(SUBSCRIPTION.to_owned())).identity_with(&attributes);
    let redelivered = drip_store::SlotRequest::for_rule(&rule, "merchant_7", &identity, 1);
    let answer = Store::reserve(&*d.store, &redelivered).await.unwrap().reservation;
    assert_eq!(answer.attempt, Attempt::Done, "a duplicate push of it is acked, not dead-lettered again");
}

/// The same with classes: a pause of the key's live class holds its bulk class's task too (the
/// pause is the key's calendar's), whose slot goes back to the calendar as it takes the next.
#[tokio::test]
async fn a_task_of_one_class_waits_for_a_pause_of_another_class_of_its_key() {
    let classed = RULES.replace(
        "limits: [ { limit: 1, per: 1s } ]",
        "limits: [ { limit: 2, per: 1h } ]\n    classes: { from: \"{attributes.priority}\", default: bulk, reserve: { live: 0.5 } }",
    );
    let d = dispatcher_with(&classed);
    let now = wall_clock_millis();
    let until = (now + SECOND).min((now / HOUR + 1) * HOUR - 1);
    assert_eq!(reserve_at(&d, "merchant_7#bulk", "first", now).await, now);
    assert_eq!(reserve_at(&d, "merchant_7#live", "second", now).await, now);
    let rule = d.state.rules.current().rules[0].clone();
    Store::pause(&*d.store, &rule, "merchant_7#live", until).await.unwrap();
    let payout = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let body = event("first", "merchant_7#bulk", now, TaskPayload::inline(b"{}"), payout);
    assert_eq!(d.run(&body, Some(&seal(&body, now, TASK_NAME))).await, StatusCode::OK);
    assert!(d.published_ids().is_empty(), "the bulk class waits for the live class's pause");
    let tasks = d.tasks.created.lock().unwrap().clone();
    assert_eq!(tasks.iter().map(|t| t.at).collect::<Vec<_>>(), [until], "the slot at the pause's end");
    let calendar = d.store.budget_state(&format!("{}|merchant_7", rule.id)).unwrap();
    assert_eq!(calendar.windows[&(HOUR, now / HOUR * HOUR)], 2, "two units in the hour, not three");
}

/// An `overflow: { url }` target that answers with `X-Drip-Cost` corrects what the event booked:
/// here the payout booked 1 of the key's 5 an hour and really cost 4, so the hour holds 4.
#[tokio::test]
async fn an_overflow_url_s_reported_cost_corrects_the_booking() {
    let target = axum::Router::new().fallback(|| async { (StatusCode::OK, [("x-drip-cost", "4")]) });
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, target).await });
    let hourly = RULES.replace("limits: [ { limit: 1, per: 1s } ]", "limits: [ { limit: 5, per: 1h } ]");
    let d = dispatcher_with(&format!("{hourly}    overflow: {{ url: \"{url}\" }}\n"));
    let now = wall_clock_millis();
    assert_eq!(reserve_at(&d, "merchant_7", "costly", now).await, now);
    let body = event(
        "costly",
        "merchant_7",
        now,
        TaskPayload::inline(b"{}"),
        BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]),
    );
    assert_eq!(d.run(&body, Some(&seal(&body, now, TASK_NAME))).await, StatusCode::OK);
    let rule = d.state.rules.current().rules[0].clone();
    let state = d.store.entity_state(&rule.id, "merchant_7").unwrap();
    let hour = drip_core::schedule::LimitState::Fixed { window: now / HOUR * HOUR, used: 4 };
    assert_eq!(state.limits.values().collect::<Vec<_>>(), [&hour], "the reported 4, not the booked 1");
    // The same task run again (Cloud Tasks retries, rarely) changes nothing.
    assert_eq!(d.run(&body, Some(&seal(&body, now, TASK_NAME))).await, StatusCode::OK);
    let state = d.store.entity_state(&rule.id, "merchant_7").unwrap();
    assert_eq!(state.limits.values().collect::<Vec<_>>(), [&hour]);
}

/// The overflow URL's calls are timed too: a batch whose events reach a target that answers at
/// once in one window and in 150 ms in the next cuts the key's latency-driven level when a later
/// window opens (two late events: one is enough unless a slow call ends in the next window and
/// carries its window over).
#[tokio::test]
async fn a_slowing_overflow_url_lowers_the_key_s_level() {
    let target = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let slow = headers.get("x-drip-message-id").is_some_and(|id| id.as_bytes().starts_with(b"slow"));
        tokio::time::sleep(std::time::Duration::from_millis(if slow { 150 } else { 1 })).await;
        StatusCode::NO_CONTENT
    });
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, target).await });
    let adapted = RULES.replace(
        "limits: [ { limit: 1, per: 1s } ]",
        "limits: [ { limit: 100, per: 1s } ]\n    adaptive: { margin: 0, latency: { smoothing: 1 } }",
    );
    let d = dispatcher_with(&format!("{adapted}    overflow: {{ url: \"{url}\" }}\n"));
    let window = (wall_clock_millis() / 1_000 + 1) * 1_000;
    let mut events: Vec<Vec<u8>> = (0..6).map(|i| task(&format!("fast{i}"), window + 10 * i, 1)).collect();
    events.extend((0..6).map(|i| task(&format!("slow{i}"), window + 1_000 + 10 * i, 1)));
    events.extend([task("last", window + 2_100, 1), task("later", window + 3_100, 1)]);
    let (body, sealed) = batch(&events, window);
    tokio::time::sleep(std::time::Duration::from_millis((window - wall_clock_millis()).max(0) as u64)).await;
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    let rule = d.state.rules.current().rules[0].clone();
    let state = d.store.entity_state(&rule.id, "merchant_7").unwrap();
    let latency = state.latency.expect("the target's latency was reported");
    assert_eq!(latency.hurt, drip_core::budgets::PPM, "cut from the ceiling: {latency:?}");
    let level = state.adaptive.expect("a level").level;
    assert!((drip_core::budgets::PPM / 2..drip_core::budgets::PPM).contains(&level), "cut, by half at most: {level}");
}

/// The events the tasks created so far carry (not the wakes), by message id and slot.
fn events_carried(d: &Dispatcher) -> Vec<(String, Millis)> {
    let created = d.tasks.created.lock().unwrap().clone();
    created.iter().filter(|task| !is_wake(&task.body)).flat_map(|task| carried(&task.body)).collect()
}

/// The events a recorded task carries (a batch's, or its own), by message id and slot.
fn carried(body: &[u8]) -> Vec<(String, Millis)> {
    let bodies: Vec<Vec<u8>> = match TaskBatch::parse(body) {
        Some(batch) => batch.batch.iter().map(|event| event.get().as_bytes().to_vec()).collect(),
        None => vec![body.to_vec()],
    };
    bodies
        .iter()
        .map(|body| serde_json::from_slice::<TaskBody>(body).unwrap())
        .map(|task| (task.message_id, task.rate_limit_meta.scheduled_for))
        .collect()
}

/// A wake hands over first what a drain that died left half done (taken from the queue, its task
/// never made), then drains the rest of the key's parked events in order: each gets one task at
/// its slot, the queue and the handing list end empty, and the same wake run again makes nothing.
#[tokio::test]
async fn a_wake_hands_over_what_a_dead_drain_left_then_drains_the_queue_in_order() {
    let key = "merchant_p";
    let (d, rule, now) = dispatcher_with_paused_key(key).await;
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let ids = ["w0", "w1", "w2"];
    let identities: Vec<String> = ids
        .iter()
        .map(|id| MessageRef::new((*id).to_owned(), Some(SUBSCRIPTION.to_owned())).identity_with(&attributes))
        .collect();
    for (id, identity) in ids.iter().zip(&identities) {
        let request = SlotRequest::for_rule(&rule, key, identity, 1);
        let reserved = d.store.reserve(&request).await.unwrap();
        assert_eq!(reserved.reservation.status, Status::Parked, "behind a 10 s pause");
        let body = event(id, key, now, TaskPayload::inline(b"{}"), attributes.clone());
        d.store.park_body(&request, &body, HOUR).await.unwrap();
        d.store.complete(&request, &reserved).await.unwrap();
    }
    Store::resume(&*d.store, &rule, key).await.unwrap();
    // A drain that died after taking w0 from the queue, before making its task.
    let deadline = wall_clock_millis() + 2 * SECOND;
    let taken = SlotRequest { unpark: Some(deadline), ..SlotRequest::for_rule(&rule, key, &identities[0], 1) };
    assert!(matches!(d.store.unpark(&taken).await.unwrap().0, Unpark::Decided(_)));
    assert_eq!(d.store.handing(&rule, key).await.unwrap().len(), 1);

    let events = run_wake(&d, &rule, key).await;
    let created = d.tasks.created.lock().unwrap().clone();
    assert_eq!(events.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ids, "each once: {events:?}");
    let slots: Vec<&Millis> = events.iter().map(|(_, slot)| slot).collect();
    assert!(slots.windows(2).all(|pair| pair[0] <= pair[1]), "in order: {events:?}");
    assert!(d.store.handing(&rule, key).await.unwrap().is_empty(), "nothing left half handed over");
    assert!(d.store.parked_bodies(&rule, key, 10).await.unwrap().is_empty(), "the queue is empty");

    run_wake(&d, &rule, key).await;
    assert_eq!(d.tasks.created.lock().unwrap().len(), created.len(), "a wake run twice makes nothing more");
}

/// An event that arrives while its key has events parked joins the queue without a search: one
/// whose cost is over the count in force parks like the others, and the drain dead-letters it with
/// that reason when it reaches the head; the events around it get their tasks in order.
#[tokio::test]
async fn a_drain_dead_letters_a_parked_event_whose_cost_is_over_the_count_when_its_turn_comes() {
    let key = "merchant_c";
    let (d, rule, now) = dispatcher_with_paused_key(key).await;
    for (id, cost) in [("c0", 1), ("c1", 11), ("c2", 1)] {
        let status = reserve_or_park_costing(&d, &rule, (key, id, cost), now).await;
        assert_eq!(status, Status::Parked, "{id}: behind a 10 s pause");
    }
    Store::resume(&*d.store, &rule, key).await.unwrap();
    let events = run_wake(&d, &rule, key).await;
    assert_eq!(events.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["c0", "c2"], "{events:?}");
    let letters = d.pubsub.published.lock().unwrap().clone();
    let letters: Vec<_> = letters.iter().filter(|p| p.topic == "drip-dlq").collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attributes["drip-reason"], "cost_exceeds_limit");
    assert!(d.store.parked_bodies(&rule, key, 10).await.unwrap().is_empty(), "the queue is empty");
}

/// A dispatcher whose rule parks a throttled key's backlog (`limit` a second): it and its rule.
fn parking_dispatcher(limit: u64) -> (Dispatcher, Rule) {
    let rules =
        RULES.replace("    park_horizon: off\n", "").replace("limit: 1, per: 1s", &format!("limit: {limit}, per: 1s"));
    let d = dispatcher_with(&rules);
    let rule = d.state.rules.current().rules[0].clone();
    (d, rule)
}

/// A dispatcher whose rule parks a throttled key's backlog (10 a second), with `key` paused for
/// 10 s from now: the rule and now.
async fn dispatcher_with_paused_key(key: &str) -> (Dispatcher, Rule, Millis) {
    let (d, rule) = parking_dispatcher(10);
    let now = wall_clock_millis();
    Store::pause(&*d.store, &rule, key, now + 10 * SECOND).await.unwrap();
    (d, rule, now)
}

/// Runs `key`'s wake as its sealed task does, answered OK: every event the tasks made so far
/// carry, with its slot, sorted.
async fn run_wake(d: &Dispatcher, rule: &Rule, key: &str) -> Vec<(String, Millis)> {
    let body = WakeTask { wake: WakeOf { rule_id: rule.id.clone(), key: key.to_owned() } }.body();
    let sealed = seal(&body, wall_clock_millis(), TASK_NAME);
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    let mut events = events_carried(d);
    events.sort();
    events
}

/// Reserves payout `id` of `key` as the limiter does, at `now`, and when it parks keeps its body
/// and completes it, as the limiter's push does: its status.
async fn reserve_or_park(
    d: &Dispatcher,
    rule: &drip_core::rules::Rule,
    (key, id): (&str, &str),
    now: Millis,
) -> Status {
    reserve_or_park_costing(d, rule, (key, id, 1), now).await
}

/// The same for a payout of `cost` units (its body says so, as the limiter's does).
async fn reserve_or_park_costing(
    d: &Dispatcher,
    rule: &drip_core::rules::Rule,
    (key, id, cost): (&str, &str, u64),
    now: Millis,
) -> Status {
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let identity = MessageRef::new(id.to_owned(), Some(SUBSCRIPTION.to_owned())).identity_with(&attributes);
    let request = SlotRequest::for_rule(rule, key, &identity, cost).at(now);
    let reserved = d.store.reserve(&request).await.unwrap();
    if reserved.reservation.status == Status::Parked {
        let mut body: TaskBody =
            serde_json::from_slice(&event(id, key, now, TaskPayload::inline(b"{}"), attributes)).unwrap();
        body.rate_limit_meta.cost = (cost != 1).then_some(cost);
        d.store.park_body(&request, &serde_json::to_vec(&body).unwrap(), HOUR).await.unwrap();
        d.store.complete(&request, &reserved).await.unwrap();
    }
    reserved.reservation.status
}

/// A dispatcher whose rule (its own limit 100 a second) draws from the budgets of `budgets` (the
/// file's section, one a fair `rail`) as `draws` says, early in a second: the rule and `rail`.
async fn fair_dispatcher(budgets: &str, draws: &str) -> (Dispatcher, Rule, Budget) {
    let rules = RULES
        .replace("    park_horizon: off\n", draws)
        .replace("rules:\n", &format!("budgets:\n{budgets}rules:\n"))
        .replace("limit: 1, per: 1s", "limit: 100, per: 1s");
    let d = dispatcher_with(&rules);
    let rule = d.state.rules.current().rules[0].clone();
    let budget = rule.fair_budget().expect("fair").clone();
    early_in_a_second().await;
    (d, rule, budget)
}

/// A fair budget's wake drains its ring in weighted round robin: two keys with events parked past
/// the near horizon, weights 3 and 1, share the next window's 8 units 6 to 2, each key's events in
/// order; the ring's next wake is armed where the window after comes within reach (one task), and
/// the same wake run again takes nothing more from the window it filled.
#[tokio::test]
async fn a_fair_budget_s_wake_shares_the_next_window_by_weight() {
    let rail = "  rail: { limits: [ { limit: 8, per: 1s } ], fair: true, weights: { merchant_big: 3 } }\n";
    let (d, rule, budget) = fair_dispatcher(rail, "    budgets: [rail]\n").await;
    let now = wall_clock_millis();
    let window = (now / SECOND + 1) * SECOND;
    for (key, count) in [("merchant_fill", 8), ("merchant_big", 10), ("merchant_small", 10)] {
        for i in 0..count {
            let status = reserve_or_park(&d, &rule, (key, &format!("{key}-{i}")), now).await;
            let expected = if key == "merchant_fill" { Status::Reserved } else { Status::Parked };
            assert_eq!(status, expected, "the current window has room for the first 8, the rest lie past the horizon");
        }
    }
    assert_eq!(
        d.store.fair_ring(FairRing { budget: &budget, partition: None }).await.unwrap().members.len(),
        2,
        "both parked keys joined the ring"
    );

    // The next window comes within the near horizon.
    tokio::time::sleep(Duration::from_millis((window - 450 - wall_clock_millis()).max(0) as u64)).await;
    let wake = FairWakeTask::of(FairRing { budget: &budget, partition: None });
    let body = wake.body();
    let sealed = seal(&body, wall_clock_millis(), TASK_NAME);
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    let created = d.tasks.created.lock().unwrap().clone();
    let events = events_carried(&d);
    let of =
        |key: &str| events.iter().filter(|(id, _)| id.starts_with(key)).map(|(id, _)| id.clone()).collect::<Vec<_>>();
    assert_eq!(of("merchant_big"), (0..6).map(|i| format!("merchant_big-{i}")).collect::<Vec<_>>(), "{events:?}");
    assert_eq!(of("merchant_small"), ["merchant_small-0", "merchant_small-1"], "{events:?}");
    assert!(events.iter().all(|(_, slot)| *slot == window), "all in the next window: {events:?}");
    let wakes: Vec<Millis> =
        created.iter().filter(|task| FairWakeTask::parse(&task.body).is_some()).map(|task| task.at).collect();
    // The deadline is the drain's start + 500 ms, the unpark's clock a few ms later on a busy
    // machine: the wake is when the window after comes within reach, not at once.
    assert_eq!(wakes.len(), 1, "one next wake: {wakes:?}");
    assert!((window + 500..window + 600).contains(&wakes[0]), "the next wake at the window after - 500 ms: {wakes:?}");

    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    let again = events_carried(&d);
    assert_eq!(again.len(), events.len(), "the window it filled takes nothing more");
}

/// A rule with classes drawing from a fair budget: each class of a key waits in the ring as its own
/// member, and a key's waiting classes share its weight. Merchant two's live and bulk classes and
/// merchant one's bulk wait past the near horizon; the next window's 8 units go 4 to each
/// merchant (2 live and 2 bulk for merchant two), each class's events in order.
#[tokio::test]
async fn a_fair_budget_shares_a_window_by_key_whatever_classes_wait() {
    let classes = "    budgets: [rail]\n    classes: { from: \"{attributes.priority}\", default: bulk, reserve: { live: 0.1 } }\n";
    let (d, rule, budget) =
        fair_dispatcher("  rail: { limits: [ { limit: 8, per: 1s } ], fair: true }\n", classes).await;
    let now = wall_clock_millis();
    let window = (now / SECOND + 1) * SECOND;
    let waiting = ["merchant_two#live", "merchant_two#bulk", "merchant_one#bulk"];
    for (key, count) in [("merchant_fill#bulk", 8), (waiting[0], 10), (waiting[1], 10), (waiting[2], 10)] {
        for i in 0..count {
            let status = reserve_or_park(&d, &rule, (key, &format!("{key}-{i}")), now).await;
            let expected = if key == "merchant_fill#bulk" { Status::Reserved } else { Status::Parked };
            assert_eq!(status, expected, "{key}: the current window has room for the first 8");
        }
    }
    let ring = d.store.fair_ring(FairRing { budget: &budget, partition: None }).await.unwrap();
    let mut members: Vec<&str> = ring.members.iter().map(|m| m.key.as_str()).collect();
    members.sort_unstable();
    assert_eq!(members, [waiting[2], waiting[1], waiting[0]], "each class of a key waits as its own member");

    tokio::time::sleep(Duration::from_millis((window - 450 - wall_clock_millis()).max(0) as u64)).await;
    let wake = FairWakeTask::of(FairRing { budget: &budget, partition: None });
    let body = wake.body();
    assert_eq!(d.run(&body, Some(&seal(&body, wall_clock_millis(), TASK_NAME))).await, StatusCode::OK);
    let events = events_carried(&d);
    let of = |key: &str| events.iter().filter(|(id, _)| id.starts_with(&format!("{key}-"))).count();
    assert_eq!(waiting.map(of), [2, 2, 4], "merchant two's classes share its turn: {events:?}");
    for key in waiting {
        let ids: Vec<&String> =
            events.iter().filter(|(id, _)| id.starts_with(&format!("{key}-"))).map(|(id, _)| id).collect();
        let expected: Vec<String> = (0..ids.len()).map(|i| format!("{key}-{i}")).collect();
        assert_eq!(ids, expected.iter().collect::<Vec<_>>(), "each class's in order");
    }
    assert!(events.iter().all(|(_, slot)| *slot == window), "all in the next window: {events:?}");
}

/// A fair budget removed from the rules while keys wait in its ring, its rule still drawing from
/// another budget of its hash tag (`api`, whose name tags the pair): its wake hands each waiting
/// key to its own drain (a wake task at once) and empties the ring, and those drains deliver what
/// was parked, each key's in order: nothing stays behind a budget that is gone. Where the rule's
/// state moved to another hash tag (it drew from the removed budget alone), no drain could find
/// the parked events there: the keys stay in the ring, for the budget's return.
#[tokio::test]
async fn a_removed_fair_budget_s_wake_hands_its_waiting_keys_to_their_own_drains() {
    let budgets = "  rail: { limits: [ { limit: 2, per: 1s } ], fair: true }\n  api: [ { limit: 1000, per: 1s } ]\n";
    let (d, rule, budget) = fair_dispatcher(budgets, "    budgets: [rail, api]\n").await;
    let now = wall_clock_millis();
    let mut parked: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for key in ["merchant_a", "merchant_b"] {
        for i in 0..4 {
            let id = format!("{key}-{i}");
            if reserve_or_park(&d, &rule, (key, &id), now).await == Status::Parked {
                parked.entry(key).or_default().push(id);
            }
        }
    }
    assert_eq!(parked.values().map(Vec::len).sum::<usize>(), 6, "two booked in the current window: {parked:?}");
    assert_eq!(d.store.fair_ring(FairRing { budget: &budget, partition: None }).await.unwrap().members.len(), 2);

    assert_eq!(budget.tag, "api");

    // Drawing from the removed budget alone, the rule's state would move to its own tag: its
    // keys stay in the ring.
    let alone = RULES.replace("    park_horizon: off\n", "").replace("limit: 1, per: 1s", "limit: 100, per: 1s");
    let moved = dispatcher_on(&alone, d.store.clone());
    let body = FairWakeTask::of(FairRing { budget: &budget, partition: None }).body();
    assert_eq!(moved.run(&body, Some(&seal(&body, wall_clock_millis(), TASK_NAME))).await, StatusCode::OK);
    assert_eq!(
        moved.store.fair_ring(FairRing { budget: &budget, partition: None }).await.unwrap().members.len(),
        2,
        "they stay for the budget's return"
    );
    assert!(moved.tasks.created.lock().unwrap().iter().all(|task| WakeTask::parse(&task.body).is_none()));

    // The budget is gone from the rules, the rule still draws from `api`; its wake runs.
    let without = RULES
        .replace("    park_horizon: off\n", "    budgets: [api]\n")
        .replace("rules:\n", "budgets:\n  api: [ { limit: 1000, per: 1s } ]\nrules:\n")
        .replace("limit: 1, per: 1s", "limit: 100, per: 1s");
    let after = dispatcher_on(&without, d.store.clone());
    assert_eq!(after.run(&body, Some(&seal(&body, wall_clock_millis(), TASK_NAME))).await, StatusCode::OK);
    assert!(
        after.store.fair_ring(FairRing { budget: &budget, partition: None }).await.unwrap().members.is_empty(),
        "the ring is empty"
    );
    let wakes: Vec<WakeTask> =
        after.tasks.created.lock().unwrap().iter().filter_map(|task| WakeTask::parse(&task.body)).collect();
    let mut woken: Vec<&str> = wakes.iter().map(|w| w.wake.key.as_str()).collect();
    woken.sort_unstable();
    assert_eq!(woken, ["merchant_a", "merchant_b"], "a wake of each waiting key's own drain");

    for wake in &wakes {
        let body = wake.body();
        assert_eq!(after.run(&body, Some(&seal(&body, wall_clock_millis(), TASK_NAME))).await, StatusCode::OK);
    }
    let delivered: Vec<String> = after
        .tasks
        .created
        .lock()
        .unwrap()
        .iter()
        .filter(|task| WakeTask::parse(&task.body).is_none())
        .flat_map(|task| carried(&task.body))
        .map(|(id, _)| id)
        .collect();
    for (key, ids) in &parked {
        let of: Vec<&String> = delivered.iter().filter(|id| id.starts_with(key)).collect();
        assert_eq!(of, ids.iter().collect::<Vec<_>>(), "{key}'s parked events, in order: {delivered:?}");
    }
}

/// Whether a task's body is a wake (a key's drain's or a fair budget's), not events.
fn is_wake(body: &[u8]) -> bool {
    WakeTask::parse(body).is_some() || FairWakeTask::parse(body).is_some()
}

/// Where the wakes are among the tasks created so far (in order), and how many tasks carry events.
fn wakes_among_tasks(d: &Dispatcher) -> (Vec<usize>, usize) {
    let created = d.tasks.created.lock().unwrap().clone();
    let wakes = created.iter().enumerate().filter(|(_, task)| is_wake(&task.body)).map(|(at, _)| at).collect();
    (wakes, created.iter().filter(|task| !is_wake(&task.body)).count())
}

/// A key's drain that takes the most one wake may (1,000) arms the next wake at once, but only
/// once the tasks of what it took exist: a wake run while they were still being handed over would
/// take them from the handing list again, each a second task and a second dispatch.
#[tokio::test]
async fn a_key_s_drain_that_takes_its_most_arms_the_next_wake_after_the_tasks() {
    let (d, rule) = parking_dispatcher(1000);
    let (key, now) = ("merchant_big", wall_clock_millis());
    Store::pause(&*d.store, &rule, key, now + 10 * SECOND).await.unwrap();
    for i in 0..1_200 {
        let status = reserve_or_park(&d, &rule, (key, &format!("big-{i}")), now).await;
        assert_eq!(status, Status::Parked, "behind a 10 s pause");
    }
    Store::resume(&*d.store, &rule, key).await.unwrap();
    let events = run_wake(&d, &rule, key).await;
    // It reads the queue 64 entries at a time, and stops at the first read past 1,000.
    assert!((1_000..1_200).contains(&events.len()), "one wake takes 1,000 or a few more: {}", events.len());
    let (wakes, tasks) = wakes_among_tasks(&d);
    assert_eq!(wakes, [tasks], "the next wake, once, after the {tasks} tasks of what it took");
    assert_eq!(d.store.handing(&rule, key).await.unwrap().len(), 0, "nothing left being handed over");
}

/// The same for a fair budget's ring: a drain that takes the next window's 1,000 units turns the
/// ring and arms its next wake (at once) after the tasks of what it took.
#[tokio::test]
async fn a_fair_drain_that_takes_its_most_arms_the_next_wake_after_the_tasks() {
    let (d, rule, budget) =
        fair_dispatcher("  rail: { limits: [ { limit: 1000, per: 1s } ], fair: true }\n", "    budgets: [rail]\n")
            .await;
    let now = wall_clock_millis();
    let window = (now / SECOND + 1) * SECOND;
    for i in 0..2_000 {
        // 100 a key (the rule's own limit a second): the first 10 keys fill this window.
        let key = format!("merchant_{}", i / 100);
        let status = reserve_or_park(&d, &rule, (&key, &format!("{key}-{i}")), now).await;
        let expected = if i < 1_000 { Status::Reserved } else { Status::Parked };
        assert_eq!(status, expected, "{key}: the window has room for 1,000, the rest lie past the horizon");
    }
    let ring = FairRing { budget: &budget, partition: None };
    assert_eq!(d.store.fair_ring(ring).await.unwrap().members.len(), 10);
    tokio::time::sleep(Duration::from_millis((window - 450 - wall_clock_millis()).max(0) as u64)).await;
    let before = wakes_among_tasks(&d).1;
    let body = FairWakeTask::of(ring).body();
    let sealed = seal(&body, wall_clock_millis(), TASK_NAME);
    assert_eq!(d.run(&body, Some(&sealed)).await, StatusCode::OK);
    let (wakes, tasks) = wakes_among_tasks(&d);
    assert!(tasks > before, "the drain made tasks");
    let booked = events_carried(&d).iter().filter(|(_, slot)| *slot >= window).count();
    assert_eq!(booked, 1_000, "one wake takes 1,000");
    assert_eq!(wakes, [tasks], "the next wake, once, after the tasks of what it took");
}

/// A late task of a key whose earlier messages are parked (a pause just ended, its drain not yet
/// run) takes its turn behind them: it parks too, its body kept, even though the current window
/// has room, and the key's drain gives it its slot after theirs. It is not published at once.
#[tokio::test]
async fn a_late_task_of_a_key_with_parked_messages_parks_behind_them() {
    let (d, rule) = parking_dispatcher(10);
    let (key, now) = ("merchant_p", wall_clock_millis());
    let past = (now - 5 * SECOND).div_euclid(SECOND) * SECOND;
    assert_eq!(reserve_at(&d, key, "late", past).await, past);
    Store::pause(&*d.store, &rule, key, now + 10 * SECOND).await.unwrap();
    for id in ["p0", "p1"] {
        assert_eq!(reserve_or_park(&d, &rule, (key, id), now).await, Status::Parked, "behind the pause");
    }
    Store::resume(&*d.store, &rule, key).await.unwrap();
    let payout = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let body = event("late", key, past, TaskPayload::inline(b"{}"), payout);
    assert_eq!(d.run(&body, Some(&seal(&body, past, TASK_NAME))).await, StatusCode::OK);
    assert!(d.published_ids().is_empty(), "not published ahead of the parked: {:?}", d.published_ids());
    let parked = d.store.parked_bodies(&rule, key, 10).await.unwrap();
    assert_eq!(parked.len(), 3, "it waits in the queue");
    assert!(parked.iter().all(Option::is_some), "each with its body");

    let events = run_wake(&d, &rule, key).await;
    assert_eq!(events.len(), 3, "each once: {events:?}");
    let slot_of = |id: &str| events.iter().find(|(e, _)| e == id).map(|(_, slot)| *slot).unwrap();
    assert!(slot_of("p0") <= slot_of("p1") && slot_of("p1") <= slot_of("late"), "in order: {events:?}");
}
