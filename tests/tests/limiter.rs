//! The limiter end to end against a real Redis, Google's Pub/Sub emulator and the Cloud Tasks
//! stand-in: every decision path, the seed example over HTTP, redelivery, failures of each
//! dependency, bad input, and OIDC.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use cloud_tasks_emulator::{Fault, Faults, TaskSnapshot, TokenSigner};
use drip_core::time::{MINUTE, Millis, format_rfc3339, parse_rfc3339};
use drip_tests::pubsub_emulator::{Pubsub, PubsubEmulator, Pulled};
use drip_tests::redis_server::{RedisCluster, RedisServer, shared_url};
use drip_tests::stack::{Callers, LimiterUnderTest, LimiterWiring, RecordingTarget, TasksStandIn, spawn_limiter};
use drip_tests::unique;
use reqwest::StatusCode;
use serde_json::{Value, json};

const RULES: &str = r#"
default_dlq_topic: {p}-default-dlq
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant_id}"
    limits: [{ limit: 2, per: 1h }]
    max_delay: 3h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
  - name: {p}-webhooks
    match: { attributes: { event_type: webhook } }
    key: "endpoint_{attributes.endpoint}"
    limits: [{ limit: 100, per: 1s }]
    max_delay: 1m
    forward: { url: "{receiver}" }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
  - name: {p}-sms
    match: { attributes: { event_type: sms } }
    key: "user_{data.user}"
    cost: "{data.parts}"
    limits: [{ limit: 5, per: 1h }]
    max_delay: 1s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
  - name: {p}-trial
    mode: shadow
    match: { attributes: { event_type: trial } }
    key: "merchant_{data.merchant_id}"
    limits: [{ limit: 2, per: 1h }]
    max_delay: 3h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
  - name: {p}-seed
    match: { attributes: { event_type: seed } }
    key: "merchant_{data.merchantId}:payout"
    limits: [{ limit: 100, per: 1m }]
    max_delay: 2h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
"#;

const SUBSCRIPTION: &str = "projects/drip-test/subscriptions/source";

struct Test {
    prefix: String,
    pubsub: Pubsub,
    tasks: TasksStandIn,
    limiter: LimiterUnderTest,
    receiver: RecordingTarget,
    http: reqwest::Client,
}

async fn topics(pubsub: &Pubsub, prefix: &str) {
    for topic in ["ready", "overflow", "dlq", "default-dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
}

async fn start_with(pubsub: Pubsub, redis_url: String, tune: impl FnOnce(&mut LimiterWiring)) -> Test {
    let prefix = unique("lim");
    topics(&pubsub, &prefix).await;
    let tasks = TasksStandIn::start().await;
    let receiver = RecordingTarget::start().await;
    let queues = tasks.queues(&prefix, 2);
    let mut wiring =
        LimiterWiring::new(redis_url, pubsub.host.clone(), &tasks, queues, format!("{}/dispatch", receiver.url));
    tune(&mut wiring);
    let rules = RULES.replace("{p}", &prefix).replace("{receiver}", &receiver.url);
    let limiter = spawn_limiter(&rules, &wiring).await;
    Test { prefix, pubsub, tasks, limiter, receiver, http: reqwest::Client::new() }
}

async fn start() -> Test {
    start_with(Pubsub::shared(), shared_url(), |_| {}).await
}

/// A limiter with OIDC on for audience `https://limiter.example`, each route class with its own
/// caller ([`callers`]), verifying tokens against the keys at `jwks`.
async fn start_with_oidc(jwks: String) -> Test {
    start_with(Pubsub::shared(), shared_url(), |w| {
        w.oidc_audience = Some("https://limiter.example".into());
        w.callers = callers();
        w.oidc_jwks_url = Some(jwks);
    })
    .await
}

/// A limiter that re-reads its rules every 50 ms, and one merchant with a backlog: of payouts a, b
/// and c (2 an hour), a and b forwarded and c waiting for the next hour in a task.
async fn with_a_backlog(merchant: u32) -> Test {
    let t = start_with(Pubsub::shared(), shared_url(), |w| w.rules_poll_ms = 50).await;
    for id in ["a", "b", "c"] {
        assert_eq!(t.payout(id, merchant).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(t.pulled("ready", 2).await.len(), 2, "2 an hour");
    assert_eq!(t.tasks().await.len(), 1, "c waits for the next hour");
    t
}

fn envelope(id: &str, attributes: &[(&str, &str)], data: &[u8]) -> Vec<u8> {
    drip_tests::push_envelope(id, SUBSCRIPTION, drip_tests::publish_time(), attributes, data)
}

impl Test {
    fn topic(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    fn rule(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// The limiter's rules file as it is now.
    fn rules_text(&self) -> String {
        std::fs::read_to_string(&self.limiter.rules_path).unwrap()
    }

    /// Writes a new rules file and waits until the limiter (polling it) runs it.
    async fn reload(&self, text: String) {
        let before = self.limiter.state.rules.version();
        std::fs::write(&self.limiter.rules_path, text).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.limiter.state.rules.version() == before {
            assert!(std::time::Instant::now() < deadline, "the new rules never applied");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The limiter's own Redis, through the store (which alone knows the key layout).
    async fn store(&self) -> drip_store::RedisStore<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.limiter.redis_url.as_str()).unwrap();
        drip_store::RedisStore::new(
            client.get_multiplexed_async_connection().await.unwrap(),
            self.limiter.namespace.clone(),
        )
    }

    /// The cost reserved for `key` in the current window of rule `name`'s first limit (fixed).
    async fn used(&self, name: &str, key: &str) -> u64 {
        let rule = self.limiter.state.rules.current().rule(&self.rule(name)).unwrap().clone();
        let state = self.store().await.entity_state(drip_store::RuleRef::of(&rule), key, &rule.limits).await.unwrap();
        match state.limits.get(&drip_core::schedule::state_id(&rule.limits[0])) {
            Some(drip_core::schedule::LimitState::Fixed { used, .. }) => *used,
            other => panic!("expected fixed-window state, found {other:?}"),
        }
    }

    async fn post(&self, body: Vec<u8>, token: Option<&str>) -> StatusCode {
        let mut request =
            self.http.post(format!("{}/push", self.limiter.url)).header("content-type", "application/json").body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.expect("the limiter answers").status()
    }

    async fn push(&self, id: &str, attributes: &[(&str, &str)], data: &[u8]) -> StatusCode {
        self.post(envelope(id, attributes, data), None).await
    }

    async fn payout(&self, id: &str, merchant: u32) -> StatusCode {
        self.push(
            id,
            &[("event_type", "payout")],
            format!(r#"{{"merchant_id":{merchant},"amount":2500.00}}"#).as_bytes(),
        )
        .await
    }

    async fn pulled(&self, topic: &str, count: usize) -> Vec<Pulled> {
        self.pubsub.pull_until(&self.topic(topic), count, Duration::from_secs(10)).await
    }

    async fn tasks(&self) -> Vec<TaskSnapshot> {
        self.tasks.client.tasks().await.unwrap()
    }
}

fn body_of(task: &TaskSnapshot) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(&task.body).unwrap()).unwrap()
}

/// The events the tasks carry: one each, or a batch task's several.
fn events_in(tasks: &[TaskSnapshot]) -> Vec<Value> {
    tasks
        .iter()
        .map(body_of)
        .flat_map(|body| match body.get("batch").and_then(Value::as_array) {
            Some(batch) => batch.clone(),
            None => vec![body],
        })
        .collect()
}

#[tokio::test]
async fn forwards_in_limit_events_to_the_topic_with_data_and_attributes() {
    let t = start().await;
    assert_eq!(t.payout("p1", 7).await, StatusCode::NO_CONTENT);
    let forwarded = t.pulled("ready", 1).await;
    assert_eq!(forwarded.len(), 1);
    assert_eq!(forwarded[0].data, br#"{"merchant_id":7,"amount":2500.00}"#);
    assert_eq!(forwarded[0].attributes["event_type"], "payout");
    assert_eq!(forwarded[0].attributes["drip-message-id"], "p1");
    assert!(t.tasks().await.is_empty());
}

#[tokio::test]
async fn forwards_to_a_url_with_the_event_and_its_metadata() {
    let t = start().await;
    assert_eq!(
        t.push("w1", &[("event_type", "webhook"), ("endpoint", "e9")], br#"{"hook":1}"#).await,
        StatusCode::NO_CONTENT
    );
    let received = t.receiver.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, br#"{"hook":1}"#);
    assert_eq!(received[0].headers["x-drip-message-id"], "w1");
    assert_eq!(received[0].headers["x-drip-key"], "endpoint_e9");
    assert_eq!(received[0].headers["content-type"], "application/json");
    let attributes: Value = serde_json::from_str(received[0].headers["x-drip-attributes"].to_str().unwrap()).unwrap();
    assert_eq!(attributes["endpoint"], "e9");

    *t.receiver.status.lock().unwrap() = 503;
    assert_eq!(
        t.push("w2", &[("event_type", "webhook"), ("endpoint", "e9")], b"{}").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "a 5xx target is transient"
    );
    // A 429 without Retry-After is the dispatcher's meaning too (drip_core::delivery): not a
    // transport retry, a new slot at once in a Cloud Task.
    *t.receiver.status.lock().unwrap() = 429;
    let before = drip_core::time::wall_clock_millis();
    assert_eq!(t.push("w2", &[("event_type", "webhook"), ("endpoint", "e9")], b"{}").await, StatusCode::NO_CONTENT);
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 1, "a 429 without Retry-After gives the event a new slot in a task: {tasks:?}");
    assert!(tasks[0].schedule_time >= before, "{tasks:?}");
    *t.receiver.status.lock().unwrap() = 400;
    assert_eq!(t.push("w3", &[("event_type", "webhook"), ("endpoint", "e9")], b"{}").await, StatusCode::NO_CONTENT);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "forward_rejected");
}

#[tokio::test]
async fn over_limit_events_become_tasks_for_the_next_window_with_name_and_body() {
    let t = start().await;
    for id in ["d1", "d2", "d3"] {
        assert_eq!(t.payout(id, 42).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(t.pulled("ready", 2).await.len(), 2);
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 1);
    let task = &tasks[0];
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap();
    let next_hour = (now / (60 * MINUTE) + 1) * 60 * MINUTE;
    assert_eq!(task.schedule_time, next_hour, "the start of the next 1h window");
    let rule = t.rule("payouts");
    let queues = &t.limiter.state.tasks.as_ref().expect("a limiter serving /push").tasks().queues;
    let queue = &queues[drip_tests::stack::queue_of(&rule, "merchant_42", queues.len())];
    assert_eq!(&task.queue, queue);
    let identity = drip_core::event::MessageRef::new("d3", Some(SUBSCRIPTION.into())).identity();
    assert_eq!(task.name, format!("{queue}/tasks/{}", drip_core::overflow::task_id(&rule, &identity, None)));
    assert_eq!(task.url, format!("{}/dispatch", t.receiver.url));
    assert_eq!(task.oidc_service_account.as_deref(), Some("drip-tasks@drip-test.iam.gserviceaccount.com"));
    let body = body_of(task);
    assert_eq!(body["isRatelimited"], true);
    assert_eq!(body["rateLimitMeta"]["key"], "merchant_42");
    assert_eq!(body["rateLimitMeta"]["windowType"], "RPH");
    assert_eq!(body["rateLimitMeta"]["limit"], 2);
    assert_eq!(body["rateLimitMeta"]["scheduledFor"], format_rfc3339(next_hour));
    assert_eq!(body["rateLimitMeta"]["overflowTopic"], t.topic("overflow"));
    assert_eq!(body["originalPayload"], json!({"merchant_id": 42, "amount": 2500.0}));
    assert_eq!(body["attributes"]["event_type"], "payout");
    assert_eq!(body["messageId"], "d3");
}

#[tokio::test]
async fn a_redelivered_message_is_reserved_once_and_scheduled_once() {
    let t = start().await;
    t.payout("r1", 5).await;
    t.payout("r2", 5).await;
    for _ in 0..3 {
        assert_eq!(t.payout("r3", 5).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(t.tasks().await.len(), 1, "one task for three deliveries");
    assert_eq!(t.used("payouts", "merchant_5").await, 1, "the next window holds r3 once");
}

/// The seed article's example over HTTP: 500 payouts, 100 a minute.
#[tokio::test]
async fn the_seed_example_through_the_push_endpoint() {
    let t = start().await;
    let second = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() % MINUTE;
    if second > 45_000 {
        tokio::time::sleep(Duration::from_millis((MINUTE - second + 500) as u64)).await;
    }
    let started = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap();
    for i in 0..500 {
        let data = format!(r#"{{"payoutId":"pay_{i}","merchantId":8421,"amount":2500.00,"currency":"INR"}}"#);
        assert_eq!(
            t.push(&format!("seed-{i}"), &[("event_type", "seed")], data.as_bytes()).await,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(t.pulled("ready", 100).await.len(), 100);
    let mut per_slot: BTreeMap<Millis, usize> = BTreeMap::new();
    for task in t.tasks().await {
        *per_slot.entry(task.schedule_time).or_default() += 1;
    }
    let minute = started / MINUTE * MINUTE;
    let expected: BTreeMap<Millis, usize> = (1..=4).map(|m| (minute + m * MINUTE, 100)).collect();
    assert_eq!(per_slot, expected);
}

#[tokio::test]
async fn every_unusable_event_is_dead_lettered_with_its_reason() {
    let t = start_with(Pubsub::shared(), shared_url(), |w| w.claim_check_max_bytes = 150 * 1024).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"this is not an envelope".to_vec(), "malformed_envelope"),
        (
            br#"{"message":{"data":"@@@","messageId":"b64","attributes":{"event_type":"payout"}}}"#.to_vec(),
            "bad_base64",
        ),
        (envelope("nj", &[("event_type", "payout")], b"not json"), "non_json_body"),
        (envelope("mk", &[("event_type", "payout")], br#"{"amount":1}"#), "missing_key_field"),
        (envelope("nm", &[("event_type", "refund")], b"{}"), "no_matching_rule"),
        (envelope("ic", &[("event_type", "sms")], br#"{"user":1,"parts":"two"}"#), "invalid_cost"),
        (envelope("ce", &[("event_type", "sms")], br#"{"user":1,"parts":6}"#), "cost_exceeds_limit"),
    ];
    for (body, reason) in &cases {
        assert_eq!(t.post(body.clone(), None).await, StatusCode::NO_CONTENT, "{reason}");
    }
    let mut reasons: Vec<String> =
        t.pulled("dlq", 6).await.iter().map(|m| m.attributes["drip-reason"].clone()).collect();
    reasons.extend(t.pulled("default-dlq", 1).await.iter().map(|m| m.attributes["drip-reason"].clone()));
    reasons.sort();
    let mut expected: Vec<String> = cases.iter().map(|(_, r)| r.to_string()).collect();
    expected.sort();
    assert_eq!(reasons, expected);

    // Beyond max_delay: five parts fill the hour, the next SMS would wait for the next hour.
    assert_eq!(t.push("s1", &[("event_type", "sms")], br#"{"user":2,"parts":5}"#).await, StatusCode::NO_CONTENT);
    assert_eq!(t.push("s2", &[("event_type", "sms")], br#"{"user":2,"parts":1}"#).await, StatusCode::NO_CONTENT);
    let late = t.pulled("dlq", 1).await;
    assert_eq!(late[0].attributes["drip-reason"], "max_delay_exceeded");
    assert_eq!(late[0].attributes["drip-key"], "user_2");
    assert_eq!(late[0].attributes["drip-rule"], t.rule("sms"));
    assert!(late[0].attributes["drip-scheduled-for"].ends_with(":00:00.000Z"));
    assert_eq!(late[0].data, br#"{"user":2,"parts":1}"#);

    // An overlong key is hashed, not refused.
    let long = "x".repeat(400);
    assert_eq!(
        t.push("k1", &[("event_type", "sms")], format!(r#"{{"user":"{long}","parts":5}}"#).as_bytes()).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        t.push("k2", &[("event_type", "sms")], format!(r#"{{"user":"{long}","parts":5}}"#).as_bytes()).await,
        StatusCode::NO_CONTENT
    );
    let hashed = t.pulled("dlq", 1).await;
    let key = &hashed[0].attributes["drip-key"];
    assert!(key.len() <= drip_core::template::MAX_KEY_BYTES && key.contains('#'), "{key}");
}

#[tokio::test]
async fn large_payloads_are_claim_checked_and_huge_ones_dead_lettered() {
    let t = start_with(Pubsub::shared(), shared_url(), |w| w.claim_check_max_bytes = 1_500_000).await;
    t.payout("l0", 3).await;
    t.payout("l1", 3).await;
    let inline = format!(r#"{{"merchant_id":3,"blob":"{}"}}"#, "i".repeat(900 * 1000));
    assert_eq!(t.push("l1b", &[("event_type", "payout")], inline.as_bytes()).await, StatusCode::NO_CONTENT);
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 1);
    assert!(body_of(&tasks[0]).get("originalPayload").is_some(), "under Cloud Tasks' 1 MB: inline");
    let big = format!(r#"{{"merchant_id":3,"blob":"{}"}}"#, "b".repeat(1_100_000));
    assert_eq!(t.push("l2", &[("event_type", "payout")], big.as_bytes()).await, StatusCode::NO_CONTENT);
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 2);
    let body = tasks.iter().map(body_of).find(|b| b["messageId"] == "l2").unwrap();
    assert!(body.get("originalPayload").is_none());
    let reference = body["claimCheck"].as_str().unwrap();
    let stored = drip_store::Store::get_payload(&t.store().await, reference).await.unwrap();
    assert_eq!(stored.as_deref(), Some(big.as_bytes()));

    let huge = format!(r#"{{"merchant_id":3,"blob":"{}"}}"#, "h".repeat(1_600_000));
    assert_eq!(t.push("l3", &[("event_type", "payout")], huge.as_bytes()).await, StatusCode::NO_CONTENT);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "payload_too_large");
    assert_eq!(dead[0].data, huge.as_bytes());
    assert_eq!(t.tasks().await.len(), 2);
}

#[tokio::test]
async fn unwrapped_pushes_are_understood() {
    let t = start().await;
    let response = t
        .http
        .post(format!("{}/push", t.limiter.url))
        .header("x-goog-pubsub-message-id", "u1")
        .header("x-goog-pubsub-subscription-name", "projects/drip-test/subscriptions/s")
        .header("event_type", "payout")
        .body(r#"{"merchant_id":11}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let forwarded = t.pulled("ready", 1).await;
    assert_eq!(forwarded[0].attributes["drip-message-id"], "u1");
}

#[tokio::test]
async fn a_push_subscription_of_the_emulator_drives_the_limiter() {
    let t = start().await;
    let source = t.topic("source");
    t.pubsub.create_topic(&source).await;
    t.pubsub.create_subscription(&source, &source, Some(&format!("{}/push", t.limiter.url))).await;
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let id = t.pubsub.publish(&source, br#"{"merchant_id":99}"#, &attributes).await;
    let forwarded = t.pulled("ready", 1).await;
    let metrics = t.http.get(format!("{}/metrics", t.limiter.url)).send().await.unwrap().text().await.unwrap();
    assert_eq!(forwarded.len(), 1, "{metrics}");
    assert_eq!(forwarded[0].attributes["drip-message-id"], id);
}

#[tokio::test]
async fn redis_down_means_5xx_and_the_redelivery_is_handled_once() {
    let mut redis = RedisServer::start(&[]);
    let t = start_with(Pubsub::shared(), redis.url(), |w| w.timeouts_ms = 1_000).await;
    assert_eq!(t.payout("f0", 1).await, StatusCode::NO_CONTENT);
    redis.stop();
    assert_eq!(t.payout("f1", 1).await, StatusCode::SERVICE_UNAVAILABLE);
    let ready = t.http.get(format!("{}/readyz", t.limiter.url)).send().await.unwrap().status();
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);
    redis.restart();
    let mut status = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..20 {
        status = t.payout("f1", 1).await;
        if status == StatusCode::NO_CONTENT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(status, StatusCode::NO_CONTENT, "the limiter reconnects");
    assert_eq!(t.payout("f1", 1).await, StatusCode::NO_CONTENT);
    let mut ids: Vec<String> =
        t.pulled("ready", 2).await.iter().map(|m| m.attributes["drip-message-id"].clone()).collect();
    ids.sort();
    assert_eq!(ids, ["f0", "f1"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.pubsub.pull(&t.topic("ready"), 10).await.is_empty(), "f1 forwarded once");
}

#[tokio::test]
async fn pubsub_down_means_5xx_and_the_redelivery_is_handled_once() {
    let t = start_with(Pubsub::own(PubsubEmulator::start()), shared_url(), |w| w.timeouts_ms = 1_500).await;
    let mut pubsub = t.pubsub;
    pubsub.emulator().unwrap().stop();
    let t = Test { pubsub, ..t };
    assert_eq!(t.payout("g1", 2).await, StatusCode::SERVICE_UNAVAILABLE);
    let mut pubsub = t.pubsub;
    pubsub.emulator().unwrap().restart();
    topics(&pubsub, &t.prefix).await;
    let t = Test { pubsub, ..t };
    let mut status = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..20 {
        status = t.payout("g1", 2).await;
        if status == StatusCode::NO_CONTENT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(status, StatusCode::NO_CONTENT);
    let forwarded = t.pulled("ready", 1).await;
    assert_eq!(forwarded.len(), 1);
    assert_eq!(t.used("payouts", "merchant_2").await, 1, "the retried message reused its reservation");
}

#[tokio::test]
async fn cloud_tasks_failing_or_hanging_means_5xx_and_one_task_after_recovery() {
    let t = start_with(Pubsub::shared(), shared_url(), |w| w.timeouts_ms = 1_000).await;
    t.payout("h0", 4).await;
    t.payout("h1", 4).await;
    for (fault, id) in [(Fault::Error, "h2"), (Fault::Hang, "h3")] {
        t.tasks.client.set_faults(Faults { create_task: fault }).await.unwrap();
        assert_eq!(t.payout(id, 4).await, StatusCode::SERVICE_UNAVAILABLE, "{fault:?}");
        t.tasks.client.set_faults(Faults::default()).await.unwrap();
        assert_eq!(t.payout(id, 4).await, StatusCode::NO_CONTENT);
        assert_eq!(t.payout(id, 4).await, StatusCode::NO_CONTENT);
    }
    let names: Vec<String> = t.tasks().await.iter().map(|task| task.name.clone()).collect();
    assert_eq!(names.len(), 2, "one task each: {names:?}");
}

#[tokio::test]
async fn oidc_tokens_are_verified_when_enabled() {
    let tasks_for_jwks = TasksStandIn::start().await;
    let jwks = tasks_for_jwks.client.jwks_url();
    let email = "push@drip-test.iam.gserviceaccount.com";
    let t = start_with_oidc(jwks).await;
    let signer = TokenSigner::test_key();
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() / 1_000;
    let claims = |iss: &str, aud: &str, email: &str, exp: i64| json!({"iss": iss, "aud": aud, "sub": email, "email": email, "email_verified": true, "iat": now - 10, "exp": exp});
    let good = signer.sign(email, "https://limiter.example", now, 3_600);
    let none_alg = format!(
        "{}.{}.",
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"alg":"none","typ":"JWT","kid":"drip-test-key-1"}"#),
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(claims("https://accounts.google.com", "https://limiter.example", email, now + 600).to_string())
    );
    let cases: Vec<(&str, Option<String>, StatusCode)> = vec![
        ("valid", Some(good), StatusCode::NO_CONTENT),
        ("missing", None, StatusCode::UNAUTHORIZED),
        ("wrong audience", Some(signer.sign(email, "https://other.example", now, 3_600)), StatusCode::UNAUTHORIZED),
        (
            "wrong issuer",
            Some(signer.sign_claims(&claims("https://evil.example", "https://limiter.example", email, now + 600))),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "wrong email",
            Some(signer.sign("intruder@evil.iam.gserviceaccount.com", "https://limiter.example", now, 3_600)),
            StatusCode::FORBIDDEN,
        ),
        ("expired", Some(signer.sign(email, "https://limiter.example", now - 7_200, 3_600)), StatusCode::UNAUTHORIZED),
        (
            "bad signature",
            Some(
                TokenSigner::from_pem(cloud_tasks_emulator::TEST_OTHER_KEY_PEM, cloud_tasks_emulator::TEST_KEY_ID)
                    .sign(email, "https://limiter.example", now, 3_600),
            ),
            StatusCode::UNAUTHORIZED,
        ),
        ("alg none", Some(none_alg), StatusCode::UNAUTHORIZED),
    ];
    for (i, (case, token, expected)) in cases.into_iter().enumerate() {
        let body = envelope(&format!("o{i}"), &[("event_type", "webhook"), ("endpoint", "oidc")], b"{}");
        assert_eq!(t.post(body, token.as_deref()).await, expected, "{case}");
    }
    assert_eq!(t.receiver.received().len(), 1, "only the valid push went through");
    let metrics = |token: Option<String>| {
        let mut request = t.http.get(format!("{}/metrics", t.limiter.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(metrics(None).await.unwrap().status(), StatusCode::UNAUTHORIZED, "metrics are not public");
    let token = signer.sign(COLLECTOR, "https://limiter.example", now, 3_600);
    assert_eq!(metrics(Some(token)).await.unwrap().status(), StatusCode::OK);
    let health = t.http.get(format!("{}/healthz", t.limiter.url)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK, "probes need no token");

    // The limits API: the same authentication, and the audit names the verified caller.
    let limits = format!("{}/v1/rules/{}/keys/merchant_5/limits", t.limiter.url, t.rule("payouts"));
    let set = t.http.put(&limits).json(&json!({ "limit": "3/1h" }));
    assert_eq!(set.send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let token = signer.sign(OPERATOR, "https://limiter.example", now, 3_600);
    let response = t.http.put(&limits).bearer_auth(&token).json(&json!({ "limit": "3/1h" })).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let change: Value = response.json().await.unwrap();
    assert_eq!(change["by"], OPERATOR, "{change}");
    let rules = t.limiter.state.rules.current();
    let rule = rules.rule_by_id(&t.rule("payouts")).unwrap();
    let history = drip_store::Store::audit_history(&t.store().await, rule, 5).await.unwrap();
    let Some(drip_store::AuditEntry::Override(latest)) = history.first() else { panic!("{history:?}") };
    assert_eq!((latest.by.as_str(), latest.after.map(|a| a.limit)), (OPERATOR, Some(3)), "kept in Redis too");
}

const PUSHER: &str = "push@drip-test.iam.gserviceaccount.com";
const OPERATOR: &str = "ops@drip-test.iam.gserviceaccount.com";
const CONSUMER: &str = "consumer@drip-test.iam.gserviceaccount.com";
const COLLECTOR: &str = "collector@drip-test.iam.gserviceaccount.com";

fn callers() -> Callers {
    Callers { push: PUSHER.into(), admin: OPERATOR.into(), feedback: CONSUMER.into(), metrics: COLLECTOR.into() }
}

/// Each route class takes its own callers' tokens and refuses every other class's (403).
#[tokio::test]
async fn each_route_class_takes_only_its_own_callers() {
    let tasks_for_jwks = TasksStandIn::start().await;
    let jwks = tasks_for_jwks.client.jwks_url();
    let t = start_with_oidc(jwks).await;
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() / 1_000;
    let token = |email: &str| TokenSigner::test_key().sign(email, "https://limiter.example", now, 3_600);
    let rule = t.rule("payouts");
    let base = t.limiter.url.clone();
    for (i, caller) in [PUSHER, OPERATOR, CONSUMER, COLLECTOR].into_iter().enumerate() {
        let bearer = token(caller);
        let routes: Vec<(&str, reqwest::RequestBuilder)> = vec![
            (
                PUSHER,
                t.http.post(format!("{base}/push")).header("content-type", "application/json").body(envelope(
                    &format!("rc{i}"),
                    &[("event_type", "webhook"), ("endpoint", "rc")],
                    b"{}",
                )),
            ),
            (OPERATOR, t.http.get(format!("{base}/v1/rules/{rule}/keys/merchant_1"))),
            (
                OPERATOR,
                t.http.put(format!("{base}/v1/rules/{rule}/keys/merchant_1/limits")).json(&json!({"limit": "5/1h"})),
            ),
            (
                CONSUMER,
                t.http
                    .post(format!("{base}/v1/feedback"))
                    .json(&json!({"rule": rule, "key": "merchant_1", "status": 503})),
            ),
            (COLLECTOR, t.http.get(format!("{base}/metrics"))),
        ];
        for (owner, request) in routes {
            let status = request.bearer_auth(&bearer).send().await.unwrap().status();
            if owner == caller {
                // Past the check: the handler answered (a 404 for a key with no state counts).
                assert!(status.is_success() || status == StatusCode::NOT_FOUND, "{caller} on its own route: {status}");
            } else {
                assert_eq!(status, StatusCode::FORBIDDEN, "{caller} on a route of {owner}");
            }
        }
    }
}

/// Tokens naming keys nobody published cause one key fetch at a time, and none within a minute of
/// the last: 50 of them after a valid one fetch nothing more.
#[tokio::test]
async fn unknown_key_ids_cannot_make_the_limiter_hammer_the_key_endpoint() {
    let tasks_for_jwks = TasksStandIn::start().await;
    let jwks = tasks_for_jwks.client.jwks_url();
    let t = start_with_oidc(jwks).await;
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() / 1_000;
    let good = TokenSigner::test_key().sign(PUSHER, "https://limiter.example", now, 3_600);
    let body = || envelope(&unique("k"), &[("event_type", "webhook"), ("endpoint", "kid")], b"{}");
    assert_eq!(t.post(body(), Some(&good)).await, StatusCode::NO_CONTENT);
    let fetches = t.limiter.state.auth.push.key_fetches();
    assert_eq!(fetches, 1, "one fetch for the first token");
    let storm = (0..50).map(|i| {
        let kid = format!("invented-{i}-{}", unique("kid"));
        let token = TokenSigner::from_pem(cloud_tasks_emulator::TEST_SIGNING_KEY_PEM, &kid).sign(
            PUSHER,
            "https://limiter.example",
            now,
            600,
        );
        let t = &t;
        async move { t.post(body(), Some(&token)).await }
    });
    let answers = futures_util::future::join_all(storm).await;
    assert!(answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED), "{answers:?}");
    assert_eq!(t.limiter.state.auth.push.key_fetches(), 1, "no fetch for 50 unknown kids within a minute");
}

#[tokio::test]
async fn a_hanging_key_endpoint_fails_verification_in_time_and_blocks_no_cached_key() {
    // A JWKS endpoint that accepts connections and never answers.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks = format!("http://{}/jwks", hanging.local_addr().unwrap());
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hanging.accept().await {
            open.push(socket);
        }
    });
    let t = start_with_oidc(jwks).await;
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() / 1_000;
    let token =
        TokenSigner::test_key().sign("push@drip-test.iam.gserviceaccount.com", "https://limiter.example", now, 600);
    let started = std::time::Instant::now();
    // Five at once: one fetch, whose failure the others waited for and share.
    let pushes = (0..5).map(|i| {
        let body = envelope(&format!("h{i}"), &[("event_type", "webhook"), ("endpoint", "oidc")], b"{}");
        t.post(body, Some(&token))
    });
    let answers = futures_util::future::join_all(pushes).await;
    assert!(answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED), "{answers:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "the key fetch has a timeout: {:?}", started.elapsed());
    assert_eq!(t.limiter.state.auth.push.key_fetches(), 1, "requests waiting for a failed fetch do not each retry it");
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let t = start().await;
    t.payout("m1", 8).await;
    let get = |path: &str| t.http.get(format!("{}{path}", t.limiter.url)).send();
    assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
    assert_eq!(get("/readyz").await.unwrap().status(), StatusCode::OK);
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    let rule = t.rule("payouts");
    assert!(metrics.contains(&format!(r#"drip_decisions_total{{rule="{rule}",outcome="forward"}} 1"#)), "{metrics}");
    assert!(metrics.contains(r#"drip_dependency_call_seconds_count{dependency="redis",result="ok"}"#), "{metrics}");
    assert!(metrics.contains("drip_delay_seconds_bucket"), "{metrics}");
    let value = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("process_resident_memory_bytes") > 1e6, "the process's own figures too");
    assert!(value("process_cpu_seconds_total") > 0.0);
    assert!(value("process_open_fds") >= 3.0 && value("process_threads") >= 1.0);
    let started = value("process_start_time_seconds");
    let now = drip_core::time::wall_clock_millis() as f64 / 1_000.0;
    assert!(now - started < 3_600.0 && started <= now + 1.0, "started {started}, now {now}");
    assert_eq!(metrics.matches("# EOF").count(), 1, "one exposition");
    assert!(metrics.trim_end().ends_with("# EOF"));
}

#[tokio::test]
async fn the_entity_endpoint_shows_use_backlog_and_drain_time() {
    let t = start().await;
    for i in 0..5 {
        assert_eq!(t.payout(&format!("i{i}"), 31).await, StatusCode::NO_CONTENT);
    }
    let url = format!("{}/v1/rules/{}/keys/merchant_31", t.limiter.url, t.rule("payouts"));
    let report: Value = t.http.get(&url).send().await.unwrap().json().await.unwrap();
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap();
    let hour = 60 * MINUTE;
    assert_eq!(report["backlog"], 3, "{report}");
    assert_eq!(report["drainsAt"], format_rfc3339((now / hour + 2) * hour), "{report}");
    assert_eq!(report["limits"][0]["limit"], "2 per 1h (fixed)");
    assert_eq!(report["limits"][0]["usedNow"], 2);
    let missing = t.http.get(format!("{}/v1/rules/nope/keys/x", t.limiter.url)).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    // The one key's longest delay, which a p99 over many keys would hide: the fifth payout's.
    let metrics = t.http.get(format!("{}/metrics", t.limiter.url)).send().await.unwrap().text().await.unwrap();
    let series = format!(r#"drip_delay_seconds_max{{rule="{}"}} "#, t.rule("payouts"));
    let longest: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("{series}: {metrics}"))
        .parse()
        .unwrap();
    let expected = ((now / hour + 2) * hour - now) as f64 / 1_000.0;
    assert!(
        (longest - expected).abs() < 10.0,
        "the longest delay {longest} s, the last payout's slot {expected} s away"
    );
}

/// The limiter on Memorystore for Redis Cluster's shape: a 3-master cluster (REDIS_CLUSTER=true).
#[tokio::test]
async fn the_limiter_works_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let t = start_with(Pubsub::shared(), cluster.urls()[0].clone(), |w| w.redis_cluster = true).await;
    for (i, merchant) in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 3)] {
        assert_eq!(t.payout(&format!("c{i}"), merchant).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(t.payout("c2", 1).await, StatusCode::NO_CONTENT, "a redelivery");
    assert_eq!(t.pulled("ready", 4).await.len(), 4);
    assert_eq!(t.tasks().await.len(), 1, "the third payout of merchant 1 waits for the next hour");
    let report: Value = t
        .http
        .get(format!("{}/v1/rules/{}/keys/merchant_1", t.limiter.url, t.rule("payouts")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["backlog"], 1, "{report}");
}

/// A changed rules file applies without a restart (polled); one that does not validate is refused
/// and the rules in force stay.
#[tokio::test]
async fn a_changed_rules_file_applies_and_a_bad_one_is_refused() {
    let t = with_a_backlog(11).await;
    let version = || t.limiter.state.rules.version();

    let rules = t.rules_text();
    t.reload(rules.replacen("limit: 2, per: 1h", "limit: 4, per: 1h", 1)).await;
    for id in ["d", "e"] {
        assert_eq!(t.payout(id, 11).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(t.tasks().await.len(), 3, "FIFO: d and e queue behind c, even with room now");
    assert_eq!(t.used("payouts", "merchant_11").await, 3, "the next hour holds c, d, e: under the new 4");
    for id in ["g", "h", "i", "j", "k"] {
        assert_eq!(t.payout(id, 12).await, StatusCode::NO_CONTENT);
    }
    let forwarded = t.pulled("ready", 4).await;
    let ids: Vec<&str> = forwarded.iter().map(|m| m.attributes["drip-message-id"].as_str()).collect();
    assert_eq!(ids, ["g", "h", "i", "j"], "4 an hour now");
    assert_eq!(t.tasks().await.len(), 4, "k waits");
    let readyz = reqwest::get(format!("{}/readyz", t.limiter.url)).await.unwrap().text().await.unwrap();
    assert!(readyz.ends_with(&version()), "{readyz}");

    let second = version();
    std::fs::write(&t.limiter.rules_path, rules.replacen("max_delay: 3h", "max_delay: 45d", 1)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let metrics_url = format!("{}/metrics", t.limiter.url);
    while !reqwest::get(&metrics_url).await.unwrap().text().await.unwrap().contains("drip_rules_refused 1") {
        assert!(std::time::Instant::now() < deadline, "the bad file was never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(version(), second, "the rules in force stay");
    assert_eq!(t.payout("f", 11).await, StatusCode::NO_CONTENT);
    assert_eq!(t.used("payouts", "merchant_11").await, 4, "still 4 an hour: f joins the next hour");
}

/// A rename that keeps the rule's `id` keeps every entity's state and backlog; one that does not
/// starts the entities afresh (what `drip rules diff` warns about).
#[tokio::test]
async fn a_rename_that_keeps_the_id_keeps_the_backlog() {
    let t = with_a_backlog(13).await;
    let original = t.rules_text();
    let (old, renamed) = (t.rule("payouts"), t.rule("payouts-renamed"));
    t.reload(original.replacen(&format!("name: {old}\n"), &format!("name: {renamed}\n    id: {old}\n"), 1)).await;
    assert!(t.limiter.state.rules.current().rule(&renamed).is_some());
    assert_eq!(t.payout("c", 13).await, StatusCode::NO_CONTENT, "c redelivered under the new name");
    assert_eq!(t.payout("d", 13).await, StatusCode::NO_CONTENT);
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 2, "no second task for c; d queues behind it: {tasks:?}");
    assert!(t.pubsub.pull(&t.topic("ready"), 10).await.is_empty(), "nothing jumped the backlog");

    t.reload(original.replacen(&format!("name: {old}\n"), &format!("name: {renamed}\n"), 1)).await;
    assert_eq!(t.payout("e", 13).await, StatusCode::NO_CONTENT);
    assert_eq!(t.pulled("ready", 1).await.len(), 1, "a new id is a new entity: e goes at once");
}

/// A rolling deploy: two limiters with different counts for one rule (same id) on one Redis, the
/// same messages pushed to both at once. No message is reserved twice (one action each) and the
/// hour's window holds at most the larger count.
#[tokio::test]
async fn two_revisions_with_different_rules_on_one_redis() {
    let t = start().await;
    let mut wiring = LimiterWiring::new(
        shared_url(),
        t.pubsub.host.clone(),
        &t.tasks,
        t.tasks.queues(&format!("{}-b", t.prefix), 2),
        format!("{}/dispatch", t.receiver.url),
    );
    wiring.namespace = t.limiter.namespace.clone();
    let rules = t.rules_text();
    let other = spawn_limiter(&rules.replacen("limit: 2, per: 1h", "limit: 5, per: 1h", 1), &wiring).await;
    let ids: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let push = |url: String, id: String| {
        let body = envelope(&id, &[("event_type", "payout")], br#"{"merchant_id":41}"#);
        let http = t.http.clone();
        async move {
            loop {
                let status = http.post(format!("{url}/push")).body(body.clone()).send().await.unwrap().status();
                if status != StatusCode::SERVICE_UNAVAILABLE {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await; // busy: the other revision is acting
            }
        }
    };
    let mut pushes = Vec::new();
    for id in &ids {
        pushes.push(tokio::spawn(push(t.limiter.url.clone(), id.clone())));
        pushes.push(tokio::spawn(push(other.url.clone(), id.clone())));
    }
    for push in pushes {
        assert_eq!(push.await.unwrap(), StatusCode::NO_CONTENT);
    }
    let (mut forwarded, mut dead): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut settled_at = None;
    loop {
        for (topic, into) in [("ready", &mut forwarded), ("dlq", &mut dead)] {
            let batch = t.pubsub.pull(&t.topic(topic), 100).await;
            into.extend(batch.iter().map(|m| m.attributes["drip-message-id"].clone()));
        }
        let acted = forwarded.len() + dead.len() + events_in(&t.tasks().await).len();
        // Once every message came out, keep reading a little: a duplicate would show then.
        if acted >= ids.len() && settled_at.is_none() {
            settled_at = Some(std::time::Instant::now());
        }
        if settled_at.is_some_and(|at| at.elapsed() > Duration::from_millis(500)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "only {acted} of {} messages came out", ids.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = events_in(&t.tasks().await);
    let delayed = events.iter().map(|event| event["messageId"].as_str().unwrap().to_owned());
    let mut all: Vec<String> = forwarded.iter().cloned().chain(delayed).chain(dead.iter().cloned()).collect();
    all.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(all, expected, "each message acted on exactly once (forwarded, delayed or dead-lettered)");
    assert!((2..=5).contains(&forwarded.len()), "this hour holds at most the larger count: {forwarded:?}");
    let mut per_hour: BTreeMap<i64, usize> = BTreeMap::new();
    for event in &events {
        let slot = parse_rfc3339(event["rateLimitMeta"]["scheduledFor"].as_str().unwrap()).unwrap();
        *per_hour.entry(slot.div_euclid(3_600_000)).or_default() += 1;
    }
    assert!(per_hour.values().all(|&n| n <= 5), "no later hour over the larger count: {per_hour:?}");
}

/// `mode: shadow` through Redis and the emulator: every event forwarded at once with the decision
/// enforcing would have taken; the reservations are recorded as if enforced.
#[tokio::test]
async fn a_shadow_rule_forwards_everything_and_says_what_it_would_have_done() {
    let t = start().await;
    for id in ["s1", "s2", "s3"] {
        assert_eq!(t.push(id, &[("event_type", "trial")], br#"{"merchant_id":61}"#).await, StatusCode::NO_CONTENT);
    }
    let forwarded = t.pulled("ready", 3).await;
    let decisions: BTreeMap<&str, &str> = forwarded
        .iter()
        .map(|m| (m.attributes["drip-message-id"].as_str(), m.attributes["drip-shadow-decision"].as_str()))
        .collect();
    assert_eq!(decisions, BTreeMap::from([("s1", "forward"), ("s2", "forward"), ("s3", "delay")]));
    assert!(t.tasks().await.is_empty(), "no task: shadow never delays");
    assert_eq!(t.used("trial", "merchant_61").await, 1, "s3's would-be slot is reserved in the next hour");
}

/// A key template change with `previous_key`: the new key starts at the old key's frontier, so
/// events never jump ahead of the backlog queued under the old key.
#[tokio::test]
async fn a_key_change_with_previous_key_keeps_the_backlog_s_frontier() {
    let t = with_a_backlog(17).await;
    let first_task = t.tasks().await[0].schedule_time;
    let original = t.rules_text();
    let old_key = "key: \"merchant_{data.merchant_id}\"\n    limits: [{ limit: 2, per: 1h }]";
    assert!(original.contains(old_key));
    let edited = original.replacen(
        old_key,
        "key: \"m_{data.merchant_id}\"\n    previous_key: \"merchant_{data.merchant_id}\"\n    limits: [{ limit: 2, per: 1h }]",
        1,
    );
    t.reload(edited).await;
    assert_eq!(t.payout("d", 17).await, StatusCode::NO_CONTENT);
    assert!(t.pubsub.pull(&t.topic("ready"), 10).await.is_empty(), "d did not jump the old key's backlog");
    let tasks = t.tasks().await;
    assert_eq!(tasks.len(), 2);
    let d = tasks.iter().find(|task| body_of(task)["messageId"] == "d").unwrap();
    assert_eq!(body_of(d)["rateLimitMeta"]["key"], "m_17");
    assert!(d.schedule_time > first_task, "d waits for the window after c's: {} vs {first_task}", d.schedule_time);
}
