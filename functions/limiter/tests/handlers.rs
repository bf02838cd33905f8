//! The limiter's app driven in process with `tower::ServiceExt::oneshot`: the reference model as
//! the store, and recording doubles for Pub/Sub and Cloud Tasks. Milliseconds per case, no services;
//! what only the real parts can show (the emulator's redelivery, the stand-in's scheduling, Redis)
//! stays in `tests/tests/limiter.rs` and the end-to-end tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use drip_core::overflow::task_id;
use drip_core::overflow::{SIGNATURE_HEADER, Signature, TaskBody, TaskPayload, TaskSigner};
use drip_core::rules::{RuleSet, ServiceRules};
use drip_core::time::{SECOND, parse_rfc3339};
use drip_gcp::doubles::{CreatedTask, Published, RecordingPublisher, RecordingTasks};
use drip_gcp::http_target::{HttpTarget, IdTokenMode};
use drip_limiter::{AppState, app};
use drip_service::metrics::ServiceMetrics;
use drip_service::shutdown::Shutdown;
use drip_service::task_batches::{TaskBatcher, TaskBatching};
use drip_service::tasks::Tasks;
use drip_store::{MemoryStore, Store};
use drip_tests::stack::SIGNING_KEY;
use tower::ServiceExt;

const SUBSCRIPTION: &str = "projects/drip-test/subscriptions/payouts-push";
const QUEUE: &str = "projects/drip-test/locations/local/queues/q0";

const RULES: &str = r#"
default_dlq_topic: drip-dlq
budgets:
  partner:
    limits: [ { limit: 4, per: 1d } ]
    max_share: 0.5
    adaptive: { margin: 0, decrease: 0.5, min: 0.25 }
  gateway:
    limits: [ { limit: 4, per: 1h } ]
    floors: { otp: 0.5 }
  carrier:
    limits: [ { limit: 6, per: 1h } ]
    leases: { partitions: 3, chunk: 0.01 }
rules:
  - name: carrier_sms
    match: { attributes: { event_type: carrier_sms } }
    key: "user_{attributes.user}"
    limits: [ { limit: 10, per: 1h } ]
    budgets: [carrier]
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: carrier-ready }
    overflow_topic: carrier-overflow
  - name: blast
    match: { attributes: { event_type: blast } }
    key: "campaign_{attributes.campaign}"
    limits: [ { limit: 1000, per: 1h } ]
    budgets: [gateway]
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: sms-ready }
    overflow_topic: sms-overflow
  - name: settlements
    match: { attributes: { event_type: settlement } }
    key: "merchant_{attributes.merchant}"
    limits: [ { limit: 10, per: 1h } ]
    classes: { from: "{attributes.priority}", default: bulk, reserve: { live: 0.2 } }
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: settlements-ready }
    overflow_topic: settlements-overflow
  - name: settlements_adaptive
    match: { attributes: { event_type: settlement_adaptive } }
    key: "merchant_{attributes.merchant}"
    limits: [ { limit: 10, per: 1h } ]
    classes: { from: "{attributes.priority}", default: bulk, reserve: { live: 0.2 } }
    adaptive: { margin: 0, decrease: 0.5, min: 0.2 }
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: settlements-ready }
    overflow_topic: settlements-overflow
  - name: otp
    match: { attributes: { event_type: otp } }
    key: "user_{attributes.user}"
    limits: [ { limit: 10, per: 1h } ]
    budgets: [gateway]
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: sms-ready }
    overflow_topic: sms-overflow
  - name: inline
    match: { attributes: { event_type: inline } }
    key: "merchant_{attributes.merchant}"
    limits: [ { limit: 1, per: 2s, window: fixed } ]
    max_delay: 1h
    inline_wait: 3s
    forward: { topic: inline-ready }
    overflow_topic: inline-overflow
  - name: alerts
    match: { attributes: { event_type: alert } }
    key: "tenant_{attributes.tenant}"
    limits: [ { limit: 100, per: 1d, window: fixed } ]
    budgets: [partner]
    feedback: partner
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: alerts-ready }
    overflow_topic: alerts-overflow
  - name: kyc
    match: { attributes: { event_type: kyc } }
    key: "tenant_{attributes.tenant}"
    limits: [ { limit: 10, per: 1d, window: fixed } ]
    adaptive: { margin: 0.1, decrease: 0.8, min: 0.2 }
    max_delay: 1h
    forward: { topic: kyc-ready }
    overflow_topic: kyc-overflow
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant_id}"
    limits: [ { limit: 2, per: 1h, window: fixed } ]
    max_delay: 1h
    inline_wait: 0s
    forward: { topic: payouts-ready }
    overflow_topic: payouts-overflow
    dlq_topic: payouts-dlq
  - name: sms
    match: { attributes: { event_type: sms } }
    key: "user_{data.user}"
    cost: "{data.parts}"
    limits: [ { limit: 5, per: 1h, window: fixed } ]
    max_delay: 1h
    forward: { topic: sms-ready }
    overflow_topic: sms-overflow
    dlq_topic: sms-dlq
  - name: hooks
    match: { attributes: { event_type: hook } }
    key: "endpoint_{attributes.endpoint}"
    limits: [ { limit: 100, per: 1s, window: fixed } ]
    max_delay: 1h
    inline_wait: 0s
    forward: { url: "TARGET" }
    overflow_topic: hooks-overflow
    dlq_topic: hooks-dlq
  - name: learning_hooks
    match: { attributes: { event_type: learning_hook } }
    key: "endpoint_{attributes.endpoint}"
    limits: [ { limit: 20, per: 1s }, { limit: 600, per: 1m } ]
    learn: headers
    max_delay: 1h
    inline_wait: 0s
    forward: { url: "TARGET" }
    overflow_topic: hooks-overflow
    dlq_topic: hooks-dlq
  - name: slowhooks
    match: { attributes: { event_type: slowhook } }
    key: "endpoint_{attributes.endpoint}"
    limits: [ { limit: 1000, per: 1s, window: fixed } ]
    max_delay: 1h
    inline_wait: 0s
    forward: { url: "TARGET" }
    overflow_topic: hooks-overflow
    dlq_topic: hooks-dlq
    adaptive: { margin: 0, decrease: 0.5, min: 0.2, latency: { tolerance: 2, smoothing: 1, recover: 2 } }
  - name: trial
    mode: shadow
    match: { attributes: { event_type: trial } }
    key: "merchant_{data.merchant_id}"
    limits: [ { limit: 2, per: 1h, window: fixed } ]
    max_delay: 1h
    inline_wait: 0s
    forward: { topic: trial-ready }
    overflow_topic: trial-overflow
    dlq_topic: trial-dlq
  - name: trial_classes
    mode: shadow
    match: { attributes: { event_type: trial_classes } }
    key: "merchant_{data.merchant_id}"
    limits: [ { limit: 5, per: 1h } ]
    classes: { from: "{attributes.priority}", default: bulk, reserve: { live: 0.2 } }
    max_delay: 30d
    inline_wait: 0s
    forward: { topic: trial-classes-ready }
    overflow_topic: trial-classes-overflow
  - name: trial_sms
    mode: shadow
    match: { attributes: { event_type: trial_sms } }
    key: "user_{data.user}"
    cost: "{data.parts}"
    limits: [ { limit: 3, per: 1s, window: gcra, burst: 3 } ]
    max_delay: 1h
    forward: { topic: trial-sms-ready }
    overflow_topic: trial-sms-overflow
    dlq_topic: trial-sms-dlq
"#;

struct Limiter {
    state: AppState,
    store: Arc<MemoryStore>,
    pubsub: Arc<RecordingPublisher>,
    tasks: Arc<RecordingTasks>,
}

fn limiter() -> Limiter {
    limiter_forwarding_to("http://127.0.0.1:9/unused")
}

fn limiter_forwarding_to(target: &str) -> Limiter {
    let rules = RULES.replace("TARGET", target);
    let rules = ServiceRules::new(RuleSet::parse("handlers.yaml", &rules).unwrap(), "handlers.yaml").unwrap();
    let (store, pubsub, tasks) =
        (Arc::new(MemoryStore::new()), Arc::new(RecordingPublisher::default()), Arc::new(RecordingTasks::default()));
    let metrics = Arc::new(ServiceMetrics::new(("decisions", "-"), ("delay_seconds", "-")));
    let state = AppState {
        rules: drip_service::live_rules::LiveRules::fixed(rules, metrics.shared.clone()),
        store: store.clone(),
        publishers: pubsub.clone(),
        tasks: Some(TaskBatcher::new(
            Tasks::new(tasks.clone(), vec![QUEUE.to_owned()], TaskSigner::new(SIGNING_KEY)),
            TaskBatching { max_events: 500, bucket: SECOND, in_flight: 1, linger: 0 },
        )),
        target: Arc::new(HttpTarget::new(Duration::from_secs(5), IdTokenMode::Never).unwrap()),
        latency: Arc::default(),
        auth: drip_limiter::LimiterAuth::off(),
        metrics,
        claim_check_max_bytes: 4 * 1024 * 1024,
        attempt_deadline: Duration::from_secs(5),
        lease: 10_000,
        shutdown: Shutdown::new(Duration::from_secs(10), Duration::from_secs(1)),
        dead_letters: Arc::default(),
    };
    Limiter { state, store, pubsub, tasks }
}

fn envelope(id: &str, attributes: &[(&str, &str)], data: &[u8]) -> Vec<u8> {
    let now = drip_core::time::format_rfc3339(drip_core::time::wall_clock_millis());
    drip_tests::push_envelope(id, SUBSCRIPTION, &now, attributes, data)
}

impl Limiter {
    async fn post(&self, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let request = Request::post(path).header("content-type", "application/json").body(Body::from(body)).unwrap();
        let response = app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        (status, axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec())
    }

    async fn push(&self, id: &str, attributes: &[(&str, &str)], data: &[u8]) -> StatusCode {
        self.post("/push", envelope(id, attributes, data)).await.0
    }

    async fn payout(&self, id: &str, merchant: u32) -> StatusCode {
        self.push(id, &[("event_type", "payout")], format!(r#"{{"merchant_id":{merchant}}}"#).as_bytes()).await
    }

    fn published(&self, topic: &str) -> Vec<Published> {
        self.pubsub.published.lock().unwrap().iter().filter(|p| p.topic == topic).cloned().collect()
    }

    fn tasks(&self) -> Vec<CreatedTask> {
        self.tasks.created.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn each_push_gets_its_action_and_reason() {
    struct Case {
        name: &'static str,
        attributes: &'static [(&'static str, &'static str)],
        data: &'static [u8],
        topic: &'static str,
        reason: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "in limit: forwarded",
            attributes: &[("event_type", "payout")],
            data: br#"{"merchant_id":1}"#,
            topic: "payouts-ready",
            reason: None,
        },
        Case {
            name: "no rule matches",
            attributes: &[("event_type", "refund")],
            data: br#"{"merchant_id":1}"#,
            topic: "drip-dlq",
            reason: Some("no_matching_rule"),
        },
        Case {
            name: "the key's field is missing",
            attributes: &[("event_type", "payout")],
            data: br#"{"merchant":1}"#,
            topic: "payouts-dlq",
            reason: Some("missing_key_field"),
        },
        Case {
            name: "the body is not JSON",
            attributes: &[("event_type", "payout")],
            data: b"\x00\x01",
            topic: "payouts-dlq",
            reason: Some("non_json_body"),
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let l = limiter();
        let id = format!("m{i}");
        assert_eq!(l.push(&id, case.attributes, case.data).await, StatusCode::NO_CONTENT, "{}", case.name);
        let published = l.pubsub.published.lock().unwrap().clone();
        assert_eq!(published.len(), 1, "{}: one message, on one topic: {published:?}", case.name);
        let message = &published[0];
        assert_eq!(message.topic, case.topic, "{}", case.name);
        assert_eq!(message.data, case.data, "{}: the data as it came", case.name);
        assert_eq!(message.attributes["drip-message-id"], id, "{}", case.name);
        assert_eq!(message.attributes.get("drip-reason").map(String::as_str), case.reason, "{}", case.name);
        assert!(l.tasks().is_empty(), "{}", case.name);
    }
}

#[tokio::test]
async fn a_malformed_push_request_is_dead_lettered_with_its_reason() {
    let l = limiter();
    let (status, _) = l.post("/push", b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "acked once dead-lettered");
    let dead = l.published("drip-dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attributes["drip-reason"], "malformed_envelope");
    assert_eq!(dead[0].data, b"{not json");
    let metrics = l.state.metrics.shared.render();
    assert!(metrics.contains(r#"drip_decisions_total{rule="-",outcome="malformed_envelope"} 1"#), "{metrics}");
}

#[tokio::test]
async fn over_the_limit_a_signed_task_is_created_for_the_slot_and_beyond_max_delay_dead_lettered() {
    let l = limiter();
    for id in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(l.payout(id, 7).await, StatusCode::NO_CONTENT, "{id}");
    }
    assert_eq!(l.published("payouts-ready").len(), 2, "two a hour now");
    let tasks = l.tasks();
    let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(tasks.len(), 2, "two in the next hour's window: {ids:?}");
    let hour = drip_core::time::HOUR;
    let next_window = (drip_core::time::wall_clock_millis() / hour + 1) * hour;
    for (task, id) in tasks.iter().zip(["c", "d"]) {
        assert_eq!(task.queue, QUEUE);
        assert_eq!(task.at, next_window, "{id} waits for the next window");
        let identity = drip_core::event::MessageRef::new(id, Some(SUBSCRIPTION.to_owned())).identity();
        assert_eq!(task.id, task_id("payouts", &identity, None));
        let seal = TaskSigner::new(SIGNING_KEY).verify(Some(&task.headers[SIGNATURE_HEADER]), &task.id, &task.body);
        let span = drip_service::tasks::DEFAULT_RETRY_SPAN;
        assert_eq!(
            seal,
            Signature::Sealed { slot: next_window, expires: next_window + span },
            "sealed for its name and slot"
        );
        let body: TaskBody = serde_json::from_slice(&task.body).unwrap();
        assert_eq!(body.message_id, id);
        assert_eq!(body.rate_limit_meta.scheduled_for, next_window);
        assert_eq!(body.payload.data().unwrap(), br#"{"merchant_id":7}"#);
    }
    let dead = l.published("payouts-dlq");
    assert_eq!(dead.len(), 2, "e and f would wait past the next window: more than max_delay (1h)");
    assert!(dead.iter().all(|d| d.attributes["drip-reason"] == "max_delay_exceeded"));
}

/// `drip dlq replay` publishes a dead letter's event again with `drip-replay-of` (the message it
/// was) and `drip-replay-published` (its dead letter's time): a second replay of it, under
/// another Pub/Sub message id, is the same message to the limiter and is not acted on again; the
/// replay of another dead letter is.
#[tokio::test]
async fn a_dead_letter_replayed_twice_is_acted_on_once() {
    let l = limiter();
    let replay = |of: &'static str| {
        [("event_type", "payout"), ("drip-replay-of", of), ("drip-replay-published", "2026-08-03T12:00:00.000Z")]
    };
    let data = br#"{"merchant_id":5}"#;
    assert_eq!(l.push("r1", &replay("m9@0a1b2c3d4e5f"), data).await, StatusCode::NO_CONTENT);
    assert_eq!(l.push("r2", &replay("m9@0a1b2c3d4e5f"), data).await, StatusCode::NO_CONTENT, "replayed again");
    let forwarded = l.published("payouts-ready");
    assert_eq!(forwarded.len(), 1, "one forward for one dead letter replayed twice");
    assert_eq!(forwarded[0].attributes["drip-replay-of"], "m9@0a1b2c3d4e5f", "the forward says what it replays");
    assert_eq!(l.push("r3", &replay("m10@0a1b2c3d4e5f"), data).await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("payouts-ready").len(), 2, "another dead letter's replay goes");
}

#[tokio::test]
async fn a_redelivery_after_the_action_is_acked_without_acting_again() {
    let l = limiter();
    for id in ["a", "b", "c"] {
        assert_eq!(l.payout(id, 3).await, StatusCode::NO_CONTENT);
    }
    for id in ["a", "b", "c", "a", "c"] {
        assert_eq!(l.payout(id, 3).await, StatusCode::NO_CONTENT, "redelivered {id}");
    }
    assert_eq!(l.published("payouts-ready").len(), 2, "each forwarded once");
    assert_eq!(l.tasks().len(), 1, "one task for c");
    let state = l.store.entity_state("payouts", "merchant_3").unwrap();
    let used: u64 = state
        .limits
        .values()
        .map(|s| match s {
            drip_core::schedule::LimitState::Fixed { used, .. } => *used,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(used, 1, "the model's latest window holds c once");
}

#[tokio::test]
async fn a_failed_publish_is_a_503_and_its_retry_acts_at_once() {
    let l = limiter();
    l.pubsub.failing.lock().unwrap().push("payouts-ready".into());
    assert_eq!(l.payout("a", 4).await, StatusCode::SERVICE_UNAVAILABLE, "Pub/Sub redelivers");
    assert!(l.published("payouts-ready").is_empty());
    l.pubsub.failing.lock().unwrap().clear();
    assert_eq!(l.payout("a", 4).await, StatusCode::NO_CONTENT, "the lease was released: no wait for it");
    assert_eq!(l.published("payouts-ready").len(), 1);
    assert_eq!(l.payout("b", 4).await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("payouts-ready").len(), 2, "the retried a kept its one reservation: b still fits");
    let metrics = l.state.metrics.shared.render();
    for (outcome, count) in [("retry", 1), ("forward", 2)] {
        let line = format!(r#"drip_decisions_total{{rule="payouts",outcome="{outcome}"}} {count}"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}

/// SIGTERM 0.5 s into a push whose publish hangs: with a 4 s grace and 1 s kept for releasing the
/// lease, the push answers 503 at 3.5 s, not at its 5 s attempt deadline (after SIGKILL).
#[tokio::test(start_paused = true)]
async fn after_sigterm_a_hanging_publish_is_cut_before_the_kill_and_its_lease_released() {
    let mut l = limiter();
    l.state.shutdown = Shutdown::new(Duration::from_secs(4), Duration::from_secs(1));
    l.pubsub.hanging.lock().unwrap().push("payouts-ready".into());
    let stopping = l.state.shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stopping.begin();
    });
    let started = tokio::time::Instant::now();
    assert_eq!(l.payout("a", 4).await, StatusCode::SERVICE_UNAVAILABLE, "Pub/Sub redelivers");
    assert_eq!(started.elapsed(), Duration::from_millis(3_500));
    l.pubsub.hanging.lock().unwrap().clear();
    // The next instance (a fresh shutdown clock) takes the redelivery over at once.
    l.state.shutdown = Shutdown::new(Duration::from_secs(10), Duration::from_secs(1));
    assert_eq!(l.payout("a", 4).await, StatusCode::NO_CONTENT, "the lease was released: no wait for it");
    assert_eq!(l.published("payouts-ready").len(), 1);
}

#[tokio::test]
async fn a_task_cloud_tasks_refuses_is_dead_lettered_not_retried() {
    let l = limiter();
    *l.tasks.refuse.lock().unwrap() = true;
    for id in ["a", "b", "c"] {
        assert_eq!(l.payout(id, 5).await, StatusCode::NO_CONTENT, "{id}");
    }
    let dead = l.published("payouts-dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].attributes["drip-message-id"], "c");
    assert_eq!(dead[0].attributes["drip-reason"], "task_rejected");
}

#[tokio::test]
async fn a_large_payload_is_claim_checked_in_the_store() {
    let l = limiter();
    for id in ["a", "b"] {
        l.payout(id, 6).await;
    }
    let big = format!(r#"{{"merchant_id":6,"blob":"{}"}}"#, "x".repeat(1_100_000));
    assert_eq!(l.push("c", &[("event_type", "payout")], big.as_bytes()).await, StatusCode::NO_CONTENT);
    let tasks = l.tasks();
    let body: TaskBody = serde_json::from_slice(&tasks[0].body).unwrap();
    let TaskPayload::ClaimCheck(reference) = &body.payload else { panic!("inline: {:?}", body.payload) };
    assert_eq!(l.store.get_payload(reference).await.unwrap().as_deref(), Some(big.as_bytes()));
}

#[tokio::test]
async fn the_entity_endpoint_and_readiness_answer_from_the_store() {
    let l = limiter();
    for id in ["a", "b", "c"] {
        l.payout(id, 9).await;
    }
    let request = Request::get("/v1/rules/payouts/keys/merchant_9").body(Body::empty()).unwrap();
    let response = app(l.state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let report: serde_json::Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap()).unwrap();
    assert_eq!(report["backlog"], 1, "{report}");
    assert_eq!(report["limits"][0]["usedNow"], 2, "{report}");
    let unknown = Request::get("/v1/rules/refunds/keys/merchant_9").body(Body::empty()).unwrap();
    assert_eq!(app(l.state.clone()).oneshot(unknown).await.unwrap().status(), StatusCode::NOT_FOUND);
    let ready = Request::get("/readyz").body(Body::empty()).unwrap();
    let ready = app(l.state.clone()).oneshot(ready).await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let body = axum::body::to_bytes(ready.into_body(), usize::MAX).await.unwrap();
    assert_eq!(body, "ready; rules fixed", "readiness names the rules version in force");
}

impl Limiter {
    async fn send(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> (StatusCode, serde_json::Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let response = app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into()))
    }
}

#[tokio::test]
async fn an_override_raises_or_lowers_one_entity_s_limit_from_the_next_reservation() {
    let l = limiter();
    let path = "/v1/rules/payouts/keys/merchant_21/limits";
    let (status, change) = l.send("PUT", path, Some(serde_json::json!({ "limit": "4/1h" }))).await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(change["before"], serde_json::Value::Null);
    assert_eq!(change["after"]["limit"], 4);
    assert_eq!(change["by"], "anonymous", "no OIDC here: the change says so");
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(l.payout(id, 21).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("payouts-ready").len(), 4, "4 an hour for merchant 21");
    for id in ["f", "g", "h"] {
        assert_eq!(l.payout(id, 22).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("payouts-ready").len(), 6, "the rule's 2 for merchant 22");

    let (status, listed) = l.send("GET", path, None).await;
    assert_eq!(status, StatusCode::OK);
    let entry = serde_json::json!({ "limit": "2 per 1h (fixed)", "count": 4, "until": null, "inForce": true });
    assert_eq!(listed, serde_json::json!([entry]));
    let (_, report) = l.send("GET", "/v1/rules/payouts/keys/merchant_21", None).await;
    assert_eq!(report["limits"][0]["capacity"], 4, "{report}");
    let mut shown = report["overrides"][0].clone();
    let set = shown.as_object_mut().and_then(|o| o.remove("set"));
    assert_eq!(shown, entry, "inspect shows an override as GET .../limits does: {report}");
    assert!(
        set.as_ref().and_then(|s| s.as_str()).is_some_and(|s| s.starts_with("set by anonymous at ")),
        "and who set it: {report}"
    );
    let (status, all) = l.send("GET", "/v1/rules/payouts/limits", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all, serde_json::json!([{ "key": "merchant_21", "overrides": [entry] }]), "only the key with one");

    let (status, change) = l.send("DELETE", &format!("{path}?per=1h"), None).await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(change["before"]["limit"], 4);
    assert_eq!(change["after"], serde_json::Value::Null);
    assert_eq!(l.send("GET", path, None).await.1, serde_json::json!([]));
    assert_eq!(l.send("GET", "/v1/rules/payouts/limits", None).await.1, serde_json::json!([]), "none left to list");
    let (status, history) = l.send("GET", "/v1/rules/payouts/history?count=5", None).await;
    assert_eq!(status, StatusCode::OK);
    let changes: Vec<_> = history.as_array().unwrap().iter().map(|e| (e["key"].clone(), e["after"].clone())).collect();
    let set = (serde_json::json!("merchant_21"), serde_json::json!({ "limit": 4, "until": null }));
    let deleted = (serde_json::json!("merchant_21"), serde_json::Value::Null);
    assert_eq!(changes, [deleted, set], "newest first: the delete, then the set");
    assert_eq!(l.send("GET", "/v1/rules/payouts/history?count=1", None).await.1.as_array().unwrap().len(), 1);
    assert_eq!(l.send("GET", "/v1/rules/nope/history", None).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_override_below_an_event_s_cost_dead_letters_it_and_an_ended_one_is_not_in_force() {
    let l = limiter();
    let path = "/v1/rules/payouts/keys/merchant_31/limits";
    // An end in the past is refused: this one ends 300 ms from now, and has ended when they arrive.
    let ends = drip_core::time::format_rfc3339(drip_core::time::wall_clock_millis() + 300);
    let (status, _) = l.send("PUT", path, Some(serde_json::json!({ "limit": "1/1h", "until": ends }))).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(400)).await;
    for id in ["a", "b"] {
        assert_eq!(l.payout(id, 31).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("payouts-ready").len(), 2, "the override ended: the rule's 2 apply");

    let sms = "/v1/rules/sms/keys/user_7/limits";
    let (status, _) = l.send("PUT", sms, Some(serde_json::json!({ "limit": "2/1h" }))).await;
    assert_eq!(status, StatusCode::OK);
    let kind = [("event_type", "sms")];
    assert_eq!(l.push("s1", &kind, br#"{"user":7,"parts":3}"#).await, StatusCode::NO_CONTENT);
    let dead = l.published("sms-dlq");
    assert_eq!(dead.len(), 1, "3 parts can never fit 2 an hour");
    assert_eq!(dead[0].attributes["drip-reason"], "cost_exceeds_limit");
    assert!(dead[0].attributes["drip-detail"].contains("override"), "{:?}", dead[0].attributes);
    assert_eq!(l.push("s1", &kind, br#"{"user":7,"parts":3}"#).await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("sms-dlq").len(), 1, "its redelivery is acked, not dead-lettered again");
    assert_eq!(l.push("s2", &kind, br#"{"user":8,"parts":3}"#).await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("sms-ready").len(), 1, "another user keeps the rule's 5");
}

#[tokio::test]
async fn override_requests_that_name_nothing_are_refused() {
    let l = limiter();
    let put = |limit: &str| Some(serde_json::json!({ "limit": limit }));
    let (status, body) = l.send("PUT", "/v1/rules/refunds/keys/k/limits", put("5/1h")).await;
    assert_eq!((status, body["error"]["message"].as_str()), (StatusCode::NOT_FOUND, Some("no such rule")));
    let (status, body) = l.send("PUT", "/v1/rules/payouts/keys/k/limits", put("5/1m")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().unwrap().contains("no limit per 1m"), "{body}");
    let (status, body) = l.send("PUT", "/v1/rules/payouts/keys/k/limits", put("0/1h")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().unwrap().contains("at least 1"), "{body}");
    let bad_until = Some(serde_json::json!({ "limit": "5/1h", "until": "tomorrow" }));
    assert_eq!(l.send("PUT", "/v1/rules/payouts/keys/k/limits", bad_until).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(l.send("DELETE", "/v1/rules/payouts/keys/k/limits?per=1d", None).await.0, StatusCode::BAD_REQUEST);
    // An end already past would never be in force; a new count keeps the end unless `forever`.
    let past = Some(serde_json::json!({ "limit": "5/1h", "until": "2020-01-01T00:00:00Z" }));
    let (status, body) = l.send("PUT", "/v1/rules/payouts/keys/k/limits", past).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().unwrap().contains("is in the past"), "{body}");
    let ends = Some(serde_json::json!({ "limit": "5/1h", "until": "2099-01-01T00:00:00Z" }));
    assert_eq!(l.send("PUT", "/v1/rules/payouts/keys/k/limits", ends).await.0, StatusCode::OK);
    let six = Some(serde_json::json!({ "limit": "6/1h", "reason": "INC-42" }));
    let (_, kept) = l.send("PUT", "/v1/rules/payouts/keys/k/limits", six).await;
    assert_eq!(kept["reason"], "INC-42", "the audit keeps why: {kept}");
    assert_eq!(
        (
            kept["after"]["limit"].as_u64(),
            kept["after"]["until"].as_str(),
            kept["at"].as_str().map(|at| parse_rfc3339(at).is_ok())
        ),
        (Some(6), Some("2099-01-01T00:00:00.000Z"), Some(true)),
        "times are RFC 3339: {kept}"
    );
    let forever = Some(serde_json::json!({ "limit": "7/1h", "forever": true }));
    let (_, dropped) = l.send("PUT", "/v1/rules/payouts/keys/k/limits", forever).await;
    assert!(dropped["after"]["until"].is_null(), "{dropped}");
}

#[tokio::test]
async fn a_shadow_rule_forwards_an_event_that_costs_more_than_its_limit_and_says_what_enforcing_would_do() {
    let l = limiter();
    let sms = [("event_type", "trial_sms")];
    for id in ["big", "big", "small"] {
        let data = if id == "big" { br#"{"user":7,"parts":5}"#.as_slice() } else { br#"{"user":7,"parts":1}"# };
        assert_eq!(l.push(id, &sms, data).await, StatusCode::NO_CONTENT, "{id}");
    }
    let said: Vec<(String, String)> = l
        .published("trial-sms-ready")
        .iter()
        .map(|m| (m.attributes["drip-message-id"].clone(), m.attributes["drip-shadow-decision"].clone()))
        .collect();
    let said: Vec<(&str, &str)> = said.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(said, [("big", "dlq:cost_exceeds_limit"), ("small", "forward")], "forwarded once each");
    assert!(l.published("trial-sms-dlq").is_empty(), "nothing dead-lettered for the limit's sake");
}

/// A shadow rule with classes forwards everything at once and says what each class would have
/// had: the bulk booked ahead at 4 of each hour's 5, the live payout in its reserve of the next.
#[tokio::test]
async fn a_shadow_rule_with_classes_says_what_each_class_would_have_had() {
    let l = limiter();
    let event = |priority: &'static str| [("event_type", "trial_classes"), ("priority", priority)];
    for i in 0..13 {
        assert_eq!(l.push(&format!("b{i}"), &event("bulk"), br#"{"merchant_id":52}"#).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.push("l0", &event("live"), br#"{"merchant_id":52}"#).await, StatusCode::NO_CONTENT);
    let forwarded = l.published("trial-classes-ready");
    assert_eq!(forwarded.len(), 14, "every event forwarded at once");
    assert!(l.tasks().is_empty(), "no task");
    let hour = drip_core::time::HOUR;
    let next = (drip_core::time::wall_clock_millis() / hour + 1) * hour;
    let slot = |i: usize| parse_rfc3339(&forwarded[i].attributes["drip-scheduled-for"]).unwrap();
    assert_eq!((slot(5), slot(8), slot(9), slot(12)), (next, next, next + hour, next + hour), "4 of 5 an hour");
    assert_eq!(forwarded[13].attributes["drip-shadow-decision"], "delay");
    assert_eq!(slot(13), next, "the live payout would have had its reserve of the next hour");
}

#[tokio::test]
async fn a_shadow_rule_forwards_everything_at_once_and_records_what_it_would_have_done() {
    let l = limiter();
    let trial = [("event_type", "trial")];
    for id in ["a", "b", "c", "d", "e", "a"] {
        assert_eq!(l.push(id, &trial, br#"{"merchant_id":51}"#).await, StatusCode::NO_CONTENT, "{id}");
    }
    let forwarded = l.published("trial-ready");
    let said: Vec<(&str, &str)> = forwarded
        .iter()
        .map(|m| (m.attributes["drip-message-id"].as_str(), m.attributes["drip-shadow-decision"].as_str()))
        .collect();
    assert_eq!(
        said,
        [("a", "forward"), ("b", "forward"), ("c", "delay"), ("d", "delay"), ("e", "dlq:max_delay_exceeded")],
        "every event forwarded at once (a's redelivery acked, not forwarded again)"
    );
    assert!(l.tasks().is_empty(), "no task");
    assert!(l.published("trial-dlq").is_empty(), "nothing dead-lettered");
    let hour = drip_core::time::HOUR;
    let next_hour = (drip_core::time::wall_clock_millis() / hour + 1) * hour;
    let scheduled = parse_rfc3339(&forwarded[2].attributes["drip-scheduled-for"]).unwrap();
    assert_eq!(scheduled, next_hour, "drip-scheduled-for is the slot it would have had");

    let (_, report) = l.send("GET", "/v1/rules/trial/keys/merchant_51", None).await;
    assert_eq!(report["limits"][0]["usedNow"], 2, "reserved as if enforced: {report}");
    assert_eq!(report["backlog"], 2, "{report}");
    let metrics = l.state.metrics.shared.render();
    assert!(metrics.contains(r#"drip_decisions_total{rule="trial",outcome="delay"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"drip_decisions_total{rule="trial",outcome="max_delay_exceeded"} 1"#), "{metrics}");
    // Every request by its route's pattern and status; the build; delays up to a month in buckets.
    assert!(metrics.contains(r#"drip_http_request_seconds_count{route="/push",status="204"}"#), "{metrics}");
    let entity = r#"drip_http_request_seconds_count{route="/v1/rules/{rule}/keys/{key}",status="200"} 1"#;
    assert!(metrics.contains(entity), "{metrics}");
    assert!(metrics.contains(&format!(r#"drip_build_info{{version="{}"}} 1"#, env!("CARGO_PKG_VERSION"))));
    let month = metrics.lines().find(|l| l.starts_with(r#"drip_delay_seconds_bucket{le="2684354"#));
    assert!(month.is_some(), "a bucket near 31 days: {metrics}");
    // What the lag alerts compare against: each rule's max_delay and delivery_margin in force.
    assert!(metrics.contains(r#"drip_max_delay_seconds{rule="inline"} 3600"#), "{metrics}");
    assert!(metrics.contains(r#"drip_delivery_margin_seconds{rule="inline"} 0"#), "{metrics}");
}

/// A target that answers 429 with `Retry-After: 2` to its first `refusals` requests, then 204.
async fn throttling_target(refusals: usize) -> (String, Arc<Mutex<usize>>) {
    let calls = Arc::new(Mutex::new(0usize));
    let counter = calls.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                let mut calls = counter.lock().unwrap();
                *calls += 1;
                if *calls <= refusals {
                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")]).into_response()
                } else {
                    StatusCode::NO_CONTENT.into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

#[tokio::test]
async fn a_429_with_retry_after_pauses_the_key_and_reschedules_the_event() {
    let (url, calls) = throttling_target(1).await;
    let l = limiter_forwarding_to(&url);
    let hook = [("event_type", "hook"), ("endpoint", "partner")];
    let before = drip_core::time::wall_clock_millis();
    assert_eq!(l.push("h1", &hook, b"{}").await, StatusCode::NO_CONTENT, "acked: the event waits in a task");
    assert_eq!(*calls.lock().unwrap(), 1);
    let tasks = l.tasks();
    assert_eq!(tasks.len(), 1, "rescheduled, not hot-retried and not dropped");
    assert!(tasks[0].at >= before + 2_000, "not before the Retry-After: {} vs {before}", tasks[0].at);
    assert!(l.published("hooks-dlq").is_empty());

    assert_eq!(l.push("h2", &hook, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(*calls.lock().unwrap(), 1, "the paused key's next event is not sent to the target");
    assert_eq!(l.tasks().len(), 2);
    assert!(l.tasks()[1].at >= tasks[0].at, "FIFO behind the rescheduled one");
    assert_eq!(l.push("h1", &hook, b"{}").await, StatusCode::NO_CONTENT, "h1 redelivered");
    assert_eq!(l.tasks().len(), 2, "acked as done: no second task");

    let (_, report) = l.send("GET", "/v1/rules/hooks/keys/endpoint_partner", None).await;
    assert!(report["pausedUntil"].as_str().is_some(), "{report}");
    let other = [("event_type", "hook"), ("endpoint", "other")];
    assert_eq!(l.push("o1", &other, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(*calls.lock().unwrap(), 2, "another key is not paused");
}

#[tokio::test]
async fn feedback_from_an_overflow_consumer_pauses_the_key() {
    let (url, calls) = throttling_target(0).await;
    let l = limiter_forwarding_to(&url);
    let feedback = |status: u16, retry_after: Option<u64>| serde_json::json!({ "rule": "hooks", "key": "endpoint_partner", "status": status, "retryAfter": retry_after });
    let hook = [("event_type", "hook"), ("endpoint", "partner")];
    assert_eq!(l.push("f0", &hook, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(*calls.lock().unwrap(), 1, "forwarded before any feedback");
    let (status, _) = l.send("POST", "/v1/feedback", Some(feedback(200, None))).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "a success changes nothing");
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback(429, Some(3)))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["pausedUntil"].as_str().is_some());
    assert_eq!(l.push("f1", &hook, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(*calls.lock().unwrap(), 1, "paused: not forwarded");
    assert_eq!(l.tasks().len(), 1, "delayed past the pause");
    // Each call is audited: who, what, before and after.
    let audit = l.store.feedback_history();
    assert_eq!(audit.len(), 2, "{audit:?}");
    let pause = &audit[1];
    assert_eq!(
        (pause.by.as_str(), pause.key.as_str(), pause.status, pause.retry_after),
        ("anonymous", "endpoint_partner", 429, Some(3))
    );
    assert_eq!(
        (pause.paused_before, pause.paused_after.map(drip_core::time::format_rfc3339)),
        (None, body["pausedUntil"].as_str().map(str::to_owned))
    );
    let (_, again) = l.send("POST", "/v1/feedback", Some(feedback(429, Some(30)))).await;
    let longer = &l.store.feedback_history()[2];
    assert_eq!(longer.paused_before, pause.paused_after, "the pause before it, as the first call left it");
    assert_eq!(
        longer.paused_after.map(drip_core::time::format_rfc3339),
        again["pausedUntil"].as_str().map(str::to_owned)
    );
    let unknown = serde_json::json!({ "rule": "nope", "key": "k", "status": 429, "retryAfter": 1 });
    assert_eq!(l.send("POST", "/v1/feedback", Some(unknown)).await.0, StatusCode::NOT_FOUND);
    let budget = serde_json::json!({ "rule": "hooks", "budget": "partner", "status": 429, "retryAfter": 1 });
    assert_eq!(l.send("POST", "/v1/feedback", Some(budget)).await.0, StatusCode::BAD_REQUEST, "not its budget");
}

/// A consumer passes the partner's headers to `/v1/feedback`: a policy below the rule's limit of
/// its window becomes a learned limit of that key (an override set by the partner's headers,
/// shown by inspect), a spent policy pauses the key until its reset, values that cannot be true
/// are named and left out; a rule that does not learn refuses headers.
#[tokio::test]
async fn headers_passed_to_feedback_teach_a_learning_rule_the_partner_s_limits() {
    let l = limiter();
    let with = |headers: serde_json::Value| serde_json::json!({ "rule": "learning_hooks", "key": "endpoint_p", "headers": headers });
    let said = serde_json::json!({
        "RateLimit-Policy": "\"second\";q=8;w=1, \"minute\";q=900;w=60, \"hour\";q=5;w=3600, \"bad\";q=-1;w=1",
        "RateLimit": "\"second\";r=7;t=1",
    });
    let (status, body) = l.send("POST", "/v1/feedback", Some(with(said))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let learned = body["learned"].as_array().expect("learned limits");
    // 8 a second is below 20; 900 a minute is above the file's 600; no limit is an hour's. And 7
    // left of 8 with nothing used here: another client took one, so this window holds 7.
    assert_eq!(learned.len(), 2, "{body}");
    let first = (learned[0]["limit"].as_str(), learned[0]["count"].as_u64());
    assert_eq!(first, (Some("20 per 1s (fixed)"), Some(8)), "{body}");
    assert_eq!(learned[1]["count"].as_u64(), Some(7), "{body}");
    let ends = learned[1]["until"].as_str().and_then(|u| drip_core::time::parse_rfc3339(u).ok()).unwrap_or(1);
    assert_eq!(ends % 1_000, 0, "the lowered count ends with its window: {body}");
    assert!(body["pausedUntil"].is_null(), "7 left: no pause: {body}");
    assert_eq!(body["ignored"].as_array().map(Vec::len), Some(1), "q=-1 is named: {body}");
    let (_, report) = l.send("GET", "/v1/rules/learning_hooks/keys/endpoint_p", None).await;
    assert_eq!(report["limits"][0]["capacity"], 7, "the learned count is in force: {report}");
    let set = report["overrides"][0]["set"].as_str().unwrap_or_default();
    assert!(set.starts_with("learned from the partner's headers at "), "{report}");

    let spent =
        serde_json::json!({ "X-RateLimit-Limit": "8", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30" });
    let (status, body) = l.send("POST", "/v1/feedback", Some(with(spent))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = body["pausedUntil"].as_str().and_then(|u| drip_core::time::parse_rfc3339(u).ok()).expect("paused");
    let wait = until - drip_core::time::wall_clock_millis();
    assert!((25_000..=30_000).contains(&wait), "until the reset, 30 s away: {wait} ms");

    let refused = serde_json::json!({ "rule": "hooks", "key": "k", "headers": { "RateLimit": "\"a\";r=0;t=5" } });
    let (status, body) = l.send("POST", "/v1/feedback", Some(refused)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("learn: headers"), "{body}");
}

/// Every route refuses in one JSON shape (Google's `{"error": {code, status, message}}`): a
/// handler's own refusal, a body with an unknown field (the framework's 422), a query it cannot
/// read and a route that does not exist; the message names what was wrong.
#[tokio::test]
async fn every_refusal_has_one_json_shape_that_names_what_was_wrong() {
    let l = limiter();
    let cases = [
        (
            "POST",
            "/v1/feedback",
            Some(serde_json::json!({ "rule": "nope", "key": "k", "status": 429 })),
            404,
            "no such rule",
        ),
        (
            "POST",
            "/v1/feedback",
            Some(serde_json::json!({ "rule": "hooks", "key": "k", "statuss": 429 })),
            422,
            "unknown field `statuss`",
        ),
        (
            "POST",
            "/v1/feedback",
            Some(serde_json::json!({ "rule": "hooks", "key": "k", "status": "429" })),
            422,
            "invalid type",
        ),
        ("GET", "/v1/rules/hooks/history?count=many", None, 400, "count"),
        ("GET", "/v1/nothing/here", None, 404, "no route GET /v1/nothing/here"),
    ];
    for (method, path, body, code, says) in cases {
        let (status, answer) = l.send(method, path, body).await;
        assert_eq!(status.as_u16(), code, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{method} {path}: {answer}");
        assert!(answer["error"]["status"].as_str().is_some_and(|s| !s.is_empty()), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{method} {path}: {message:?} names {says:?}");
    }
}

/// One answer pauses a key for at most max_pause (here half of max_delay's hour): a Retry-After of
/// 10^12 s leaves its events delayed, not dead-lettered, and the answer says what was asked;
/// feedback on a key Drip never saw pauses it all the same.
#[tokio::test]
async fn one_answer_pauses_for_at_most_max_pause_and_a_key_not_seen_yet_is_paused_too() {
    let (url, _calls) = throttling_target(0).await;
    let l = limiter_forwarding_to(&url);
    let hook = [("event_type", "hook"), ("endpoint", "capped")];
    assert_eq!(l.push("c0", &hook, b"{}").await, StatusCode::NO_CONTENT);
    let huge = serde_json::json!({ "rule": "hooks", "key": "endpoint_capped", "status": 503, "retryAfter": 1_000_000_000_000u64 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(huge)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = parse_rfc3339(body["pausedUntil"].as_str().unwrap()).unwrap();
    let cap = drip_core::time::wall_clock_millis() + 30 * drip_core::time::MINUTE;
    assert!(until <= cap && until > cap - drip_core::time::MINUTE, "capped at max_pause: {body}");
    assert_eq!(body["maxPause"], "30m", "{body}");
    assert!(parse_rfc3339(body["askedUntil"].as_str().unwrap()).unwrap() > until, "{body}");
    assert_eq!(l.push("c1", &hook, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.tasks().len(), 1, "delayed until the capped pause ends");
    assert!(l.published("hooks-dlq").is_empty(), "not dead-lettered as beyond max_delay");
    let metrics = l.state.metrics.shared.render();
    assert!(metrics.contains("drip_pauses_capped_total{target=\"rule:hooks\"} 1"), "counted: {metrics}");

    let stranger =
        serde_json::json!({ "rule": "hooks", "key": "endpoint_never_seen", "status": 429, "retryAfter": 60 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(stranger)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, report) = l.send("GET", "/v1/rules/hooks/keys/endpoint_never_seen", None).await;
    assert_eq!(report["pausedUntil"], body["pausedUntil"], "paused before its first event: {report}");
}

#[tokio::test]
async fn a_flood_from_one_tenant_leaves_the_others_their_share_of_a_budget() {
    let l = limiter();
    let from = |tenant: &'static str| [("event_type", "alert"), ("tenant", tenant)];
    for i in 0..4 {
        assert_eq!(l.push(&format!("noisy{i}"), &from("noisy"), b"{}").await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("alerts-ready").len(), 2, "half of the budget's 4 a day, then the noisy tenant waits");
    assert_eq!(l.tasks().len(), 2);
    for i in 0..3 {
        assert_eq!(l.push(&format!("quiet{i}"), &from("quiet"), b"{}").await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("alerts-ready").len(), 4, "the quiet tenant got the other half at once");
    assert_eq!(l.tasks().len(), 3, "then the budget is full for everyone");
    let (_, report) = l.send("GET", "/v1/rules/alerts/keys/tenant_quiet", None).await;
    let budget = &report["budgets"][0];
    assert_eq!(
        (budget["name"].as_str(), budget["limits"][0]["usedNow"].as_u64()),
        (Some("partner"), Some(4)),
        "{report}"
    );
}

/// A budget leased over three partitions: events of many users (so of every partition) take its
/// windows in order, never more than its 6 an hour in all, each partition booking what its home
/// leased it; inspect shows the key's partition's lease.
#[tokio::test]
async fn a_leased_budget_keeps_its_count_across_partitions() {
    let l = limiter();
    for i in 0..20 {
        let user = format!("{i}");
        let attributes = [("event_type", "carrier_sms"), ("user", user.as_str())];
        assert_eq!(l.push(&format!("s{i}"), &attributes, b"{}").await, StatusCode::NO_CONTENT);
    }
    let hour = drip_core::time::HOUR;
    let now = drip_core::time::wall_clock_millis();
    let mut per_hour = std::collections::BTreeMap::new();
    for at in l.tasks().iter().map(|t| t.at).chain(l.published("carrier-ready").iter().map(|_| now)) {
        *per_hour.entry(at / hour).or_insert(0) += 1;
    }
    assert_eq!(per_hour.values().sum::<i32>(), 20, "every event forwarded or scheduled");
    assert!(per_hour.values().all(|&n| n <= 6), "at most 6 an hour: {per_hour:?}");
    assert_eq!(per_hour.len(), 4, "20 events at 6 an hour fill 3 hours and part of a fourth: {per_hour:?}");
    let (_, report) = l.send("GET", "/v1/rules/carrier_sms/keys/user_1", None).await;
    let lease = &report["budgets"][0]["lease"];
    assert_eq!(lease["partitions"].as_u64(), Some(3), "{report}");
    let held = &lease["limits"][0];
    let leased = held["leasedNow"].as_u64().unwrap() + held["leasedAhead"].as_u64().unwrap();
    let booked = held["bookedNow"].as_u64().unwrap() + held["bookedAhead"].as_u64().unwrap();
    assert!(booked >= 1 && booked <= leased, "{report}");
}

/// A blast of one rule booked hours ahead leaves the other rule its floor of each later window:
/// an OTP sent after the blast goes out in the next hour, not after the blast.
#[tokio::test]
async fn a_floor_keeps_a_rule_its_share_of_a_budget_a_blast_booked_ahead() {
    let l = limiter();
    for i in 0..12 {
        assert_eq!(
            l.push(&format!("b{i}"), &[("event_type", "blast"), ("campaign", "c")], b"{}").await,
            StatusCode::NO_CONTENT
        );
    }
    let hour = drip_core::time::HOUR;
    let next = (drip_core::time::wall_clock_millis() / hour + 1) * hour;
    assert_eq!(l.published("sms-ready").len(), 4, "the current hour has started: its floor is anyone's");
    let blast: Vec<drip_core::time::Millis> = l.tasks().iter().map(|t| t.at).collect();
    assert_eq!(blast, [0, 0, 1, 1, 2, 2, 3, 3].map(|h| next + h * hour), "2 of each later hour's 4");
    assert_eq!(l.push("o1", &[("event_type", "otp"), ("user", "u")], b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.tasks().last().map(|t| t.at), Some(next), "the OTP takes its floor of the next hour");
    let (_, report) = l.send("GET", "/v1/rules/otp/keys/user_u", None).await;
    let floor = &report["budgets"][0]["floors"][0];
    assert_eq!((floor["rule"].as_str(), floor["floor"].as_f64()), (Some("otp"), Some(0.5)), "{report}");
    let held = &floor["limits"][0];
    assert_eq!((held["units"].as_u64(), held["usedNow"].as_u64(), held["ahead"].as_u64()), (Some(2), Some(0), Some(1)));
}

/// A merchant's bulk backlog books hours ahead; its live payouts, a class with a reserve of each
/// hour, go in the next hour. An unknown class is the default's, behind the bulk. Inspect shows the
/// key's calendar and the reserve; a per-key override holds for every class of the key.
#[tokio::test]
async fn a_live_payout_overtakes_its_merchant_s_bulk_backlog() {
    let l = limiter();
    let event = |priority: &'static str| [("event_type", "settlement"), ("merchant", "m"), ("priority", priority)];
    for i in 0..26 {
        assert_eq!(l.push(&format!("b{i}"), &event("bulk"), b"{}").await, StatusCode::NO_CONTENT);
    }
    let hour = drip_core::time::HOUR;
    let next = (drip_core::time::wall_clock_millis() / hour + 1) * hour;
    assert_eq!(l.published("settlements-ready").len(), 10, "the current hour's reserve is anyone's");
    let bulk: Vec<drip_core::time::Millis> = l.tasks().iter().map(|t| t.at).collect();
    assert_eq!(bulk, [[next; 8], [next + hour; 8]].concat(), "8 of each later hour's 10");
    assert_eq!(l.push("l0", &event("live"), b"{}").await, StatusCode::NO_CONTENT);
    let live = l.tasks().last().cloned().unwrap();
    assert_eq!(live.at, next, "the live payout takes its reserve of the next hour");
    let body: TaskBody = serde_json::from_slice(&live.body).unwrap();
    assert_eq!(body.rate_limit_meta.key, "merchant_m#live");
    let metrics = l.state.metrics.shared.render();
    assert!(metrics.contains("drip_delay_seconds_by_class_count{rule=\"settlements\",class=\"live\"} 1"), "{metrics}");
    assert_eq!(l.push("u0", &event("urgent"), b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.tasks().last().map(|t| t.at), Some(next + 2 * hour), "not a class: the default's FIFO");
    let (_, report) = l.send("GET", "/v1/rules/settlements/keys/merchant_m%23live", None).await;
    let calendar = &report["budgets"][0];
    assert_eq!(calendar["name"].as_str(), Some("classes of merchant_m"), "{report}");
    assert_eq!(calendar["limits"][0]["ahead"].as_u64(), Some(18), "{report}");
    let reserve = &calendar["floors"][0];
    assert_eq!((reserve["rule"].as_str(), reserve["limits"][0]["ahead"].as_u64()), (Some("live"), Some(1)));
    assert_eq!(report["backlog"].as_u64(), Some(1), "the class's own backlog: {report}");
    let (_, whole) = l.send("GET", "/v1/rules/settlements/keys/merchant_m", None).await;
    let classes: Vec<(&str, u64)> = whole["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["class"].as_str().unwrap(), c["backlog"].as_u64().unwrap()))
        .collect();
    assert_eq!(classes, [("live", 1), ("bulk", 17)], "each class's backlog: {whole}");
    assert_eq!((whole["backlog"].as_u64(), whole["budgets"][0]["classes"].as_bool()), (Some(18), Some(true)));
    // The partner's 429 on one class holds the key: every class waits for the pause's end.
    let feedback =
        serde_json::json!({ "rule": "settlements", "key": "merchant_m#live", "status": 429, "retryAfter": 7200 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = parse_rfc3339(body["pausedUntil"].as_str().unwrap()).unwrap();
    let before = l.tasks().len();
    assert_eq!(l.push("l1", &event("live"), b"{}").await, StatusCode::NO_CONTENT);
    // The live class waits for the key's pause: in its own queue, no slot booked, its drain's wake armed.
    let (_, report) = l.send("GET", "/v1/rules/settlements/keys/merchant_m%23live", None).await;
    assert_eq!(report["parked"].as_u64(), Some(1), "the live class's queue: {report}");
    let armed: Vec<CreatedTask> = l.tasks()[before..].to_vec();
    assert!(!armed.is_empty() && armed.iter().all(|t| t.id.starts_with("wake-")), "only a wake: {armed:?}");
    assert!(armed.iter().all(|t| t.at < until), "it looks again before the pause ends (a pause may be lifted)");
    let (_, report) = l.send("GET", "/v1/rules/settlements/keys/merchant_m%23bulk", None).await;
    assert!(report["budgets"][0]["pausedUntil"].as_str().is_some(), "the calendar holds the pause: {report}");
    // Lifting it on another class wakes the live class's drain now, not at its armed wake.
    let (before, resumed) = (l.tasks().len(), drip_core::time::wall_clock_millis());
    let (status, _) = l.send("DELETE", "/v1/rules/settlements/keys/merchant_m%23bulk/pause", None).await;
    assert_eq!(status, StatusCode::OK);
    let woken: Vec<CreatedTask> = l.tasks()[before..].to_vec();
    assert!(
        woken.iter().any(|t| t.id.starts_with("wake-") && t.at <= resumed + drip_core::time::SECOND),
        "the live class's drain woke at the resume: {woken:?}"
    );
    let (_, report) = l.send("GET", "/v1/rules/settlements/keys/merchant_m%23live", None).await;
    assert!(report["budgets"][0]["pausedUntil"].is_null(), "lifted for every class: {report}");
    // An override of the key is its calendar's: every class books against it.
    let path = "/v1/rules/settlements/keys/merchant_m%23live/limits";
    let (status, body) = l.send("PUT", path, Some(serde_json::json!({ "limit": "20/1h" }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, limits) = l.send("GET", "/v1/rules/settlements/keys/merchant_m/limits", None).await;
    assert!(limits.to_string().contains("20"), "the key's override, read by the key: {limits}");
    let (_, report) = l.send("GET", "/v1/rules/settlements/keys/merchant_m%23bulk", None).await;
    assert_eq!(report["budgets"][0]["limits"][0]["capacity"].as_u64(), Some(20), "{report}");
}

/// An adaptive rule with classes: the level is the key's (its calendar's), so a 5xx reported for
/// one class lowers the count every class of the key books against.
#[tokio::test]
async fn feedback_on_one_class_lowers_the_level_of_every_class_of_its_key() {
    let l = limiter();
    let event =
        |priority: &'static str| [("event_type", "settlement_adaptive"), ("merchant", "a"), ("priority", priority)];
    assert_eq!(l.push("l0", &event("live"), b"{}").await, StatusCode::NO_CONTENT);
    let feedback = serde_json::json!({ "rule": "settlements_adaptive", "key": "merchant_a#live", "status": 503 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback)).await;
    assert_eq!((status, body["adaptiveLevel"].as_f64()), (StatusCode::OK, Some(0.5)), "{body}");
    let (_, report) = l.send("GET", "/v1/rules/settlements_adaptive/keys/merchant_a%23bulk", None).await;
    let calendar = &report["budgets"][0];
    assert_eq!((calendar["adaptiveLevel"].as_f64(), calendar["limits"][0]["capacity"].as_u64()), (Some(0.5), Some(5)));
    assert!(report["adaptiveLevel"].is_null(), "a class has no level of its own: {report}");
    for i in 0..6 {
        assert_eq!(l.push(&format!("b{i}"), &event("bulk"), b"{}").await, StatusCode::NO_CONTENT);
    }
    assert_eq!(l.published("settlements-ready").len(), 5, "1 live and 4 bulk: 5 of the hour at the level in force");
}

#[tokio::test]
async fn feedback_on_a_budget_pauses_and_lowers_it_for_every_tenant() {
    let l = limiter();
    let feedback = serde_json::json!({ "rule": "alerts", "budget": "partner", "status": 429, "retryAfter": 30 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["target"].as_str(), body["adaptiveLevel"].as_f64()), (Some("budget:partner"), Some(0.5)));
    let alert = [("event_type", "alert"), ("tenant", "any")];
    assert_eq!(l.push("a1", &alert, b"{}").await, StatusCode::NO_CONTENT);
    assert!(l.published("alerts-ready").is_empty(), "the budget is paused for every tenant");
    assert_eq!(l.tasks().len(), 1, "delayed past the pause, not dropped");
    let (_, report) = l.send("GET", "/v1/rules/alerts/keys/tenant_any", None).await;
    let budget = &report["budgets"][0];
    assert!(budget["pausedUntil"].as_str().is_some(), "{report}");
    assert_eq!((budget["adaptiveLevel"].as_f64(), budget["limits"][0]["capacity"].as_u64()), (Some(0.5), Some(2)));
    // A key's feedback on a rule whose feedback names the budget reaches the budget too.
    let by_key = serde_json::json!({ "rule": "alerts", "key": "tenant_any", "status": 500 });
    let (_, body) = l.send("POST", "/v1/feedback", Some(by_key)).await;
    assert_eq!(body["target"].as_str(), Some("budget:partner"), "{body}");
    assert!(l.state.metrics.shared.render().contains("drip_adaptive_level{target=\"budget:partner\"} 0.5"));
}

#[tokio::test]
async fn a_5xx_lowers_one_key_s_adaptive_limit_once_per_window() {
    let l = limiter();
    let (_, report) = l.send("GET", "/v1/rules/kyc/keys/tenant_t", None).await;
    assert_eq!((report["adaptiveLevel"].as_f64(), report["limits"][0]["capacity"].as_u64()), (Some(0.9), Some(9)));
    assert_eq!(l.push("k0", &[("event_type", "kyc"), ("tenant", "t")], b"{}").await, StatusCode::NO_CONTENT);
    let feedback = serde_json::json!({ "rule": "kyc", "key": "tenant_t", "status": 503 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback.clone())).await;
    assert_eq!((status, body["adaptiveLevel"].as_f64()), (StatusCode::OK, Some(0.72)), "{body}");
    let (_, body) = l.send("POST", "/v1/feedback", Some(feedback)).await;
    assert_eq!(body["adaptiveLevel"].as_f64(), Some(0.72), "one decrease per window (a day here)");
    let (_, report) = l.send("GET", "/v1/rules/kyc/keys/tenant_t", None).await;
    assert_eq!(report["limits"][0]["capacity"].as_u64(), Some(7), "{report}");
    let (_, other) = l.send("GET", "/v1/rules/kyc/keys/tenant_u", None).await;
    assert_eq!(other["limits"][0]["capacity"].as_u64(), Some(9), "per key");
}

#[tokio::test]
async fn a_pause_that_begins_during_an_inline_wait_holds_the_event() {
    let l = limiter();
    // Start early in a 2 s window, so that the second event waits ~2 s inline for the next one.
    while drip_core::time::wall_clock_millis() % 2_000 > 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let event = [("event_type", "inline"), ("merchant", "x")];
    assert_eq!(l.push("i1", &event, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("inline-ready").len(), 1, "the first goes at once");
    let feedback = serde_json::json!({ "rule": "inline", "key": "merchant_x", "status": 429, "retryAfter": 5 });
    let later = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        l.send("POST", "/v1/feedback", Some(feedback)).await.0
    };
    let started = drip_core::time::wall_clock_millis();
    let (pushed, fed_back) = tokio::join!(l.push("i2", &event, b"{}"), later);
    assert_eq!((pushed, fed_back), (StatusCode::NO_CONTENT, StatusCode::OK));
    assert_eq!(l.published("inline-ready").len(), 1, "not forwarded inside the pause");
    // The pause is longer than the park horizon: the event parks, and its key's drain wakes
    // where the pause's end comes within the horizon.
    let tasks = l.tasks();
    assert_eq!(tasks.len(), 1, "a wake of the key's drain instead: {tasks:?}");
    assert!(drip_core::overflow::WakeTask::parse(&tasks[0].body).is_some(), "a wake task");
    let pause_ends = started + 300 + 5_000;
    assert!(tasks[0].at >= pause_ends - drip_core::rules::DEFAULT_PARK_HORIZON, "{} < {pause_ends}", tasks[0].at);
}

/// The log lines the alerts of terraform/monitoring.tf filter on are the ones the services write.
#[test]
fn the_log_lines_alerts_filter_on_are_the_ones_written() {
    let monitoring = include_str!("../../../terraform/monitoring.tf");
    let expected = [
        format!("jsonPayload.message=\"{}\"", drip_service::feedback::LONG_PAUSE_CAPPED),
        format!("jsonPayload.message=\"{}\"", drip_service::live_rules::RULES_REFUSED),
        // Logged at ERROR as the event's decision (push.rs: an alarming dead letter).
        format!("jsonPayload.decision=\"{}\"", drip_core::outcome::DlqReason::MaxDelayExceeded.as_str()),
    ];
    for filter in expected {
        assert!(monitoring.contains(&filter), "terraform/monitoring.tf filters on: {filter}");
    }
    assert!(drip_core::outcome::DlqReason::MaxDelayExceeded.is_alarming(), "so it is logged at ERROR");
}

/// Pushes that arrive together and are delayed into one bucket share a task: its body is the batch
/// of the bodies each would have alone, sealed at the first slot under a name hashed from theirs;
/// a lone delayed push keeps its own task.
#[tokio::test]
async fn delayed_pushes_of_one_bucket_share_one_task() {
    let l = limiter();
    // Merchants 5 and 7 use up this hour's two each: their next events share the next hour's slot.
    for (id, merchant) in [("a", 5), ("b", 5), ("x", 7), ("y", 7)] {
        assert_eq!(l.payout(id, merchant).await, StatusCode::NO_CONTENT);
    }
    *l.tasks.latency.lock().unwrap() = Duration::from_millis(50);
    // c finds the bucket idle: its own task at once; d and h arrive during that create and share the next.
    let ids = ["d", "h"];
    let together = tokio::join!(l.payout("c", 5), l.payout(ids[0], 5), l.payout(ids[1], 7));
    assert_eq!(together, (StatusCode::NO_CONTENT, StatusCode::NO_CONTENT, StatusCode::NO_CONTENT));
    assert_eq!(l.payout("e", 6).await, StatusCode::NO_CONTENT);
    assert_eq!(l.payout("f", 6).await, StatusCode::NO_CONTENT);
    assert_eq!(l.payout("g", 6).await, StatusCode::NO_CONTENT, "alone: its own task");

    let tasks = l.tasks();
    assert_eq!(tasks.len(), 3, "{:?}", tasks.iter().map(|t| &t.id).collect::<Vec<_>>());
    let first: TaskBody = serde_json::from_slice(&tasks[0].body).expect("c's own task body");
    assert_eq!(first.message_id, "c");
    let shared = &tasks[1];
    let names: Vec<String> = ids
        .iter()
        .map(|id| {
            task_id("payouts", &drip_core::event::MessageRef::new(*id, Some(SUBSCRIPTION.to_owned())).identity(), None)
        })
        .collect();
    assert_eq!(shared.id, drip_core::overflow::batch_task_id(&names.iter().map(String::as_str).collect::<Vec<_>>()));
    let batch = drip_core::overflow::TaskBatch::parse(&shared.body).expect("a batch body");
    let carried: Vec<String> =
        batch.batch.iter().map(|event| serde_json::from_str::<TaskBody>(event.get()).unwrap().message_id).collect();
    assert_eq!(carried, ids);
    let seal = TaskSigner::new(SIGNING_KEY).verify(Some(&shared.headers[SIGNATURE_HEADER]), &shared.id, &shared.body);
    assert!(matches!(seal, Signature::Sealed { slot, .. } if slot == shared.at), "sealed at its first slot");
    let alone: TaskBody = serde_json::from_slice(&tasks[2].body).expect("g's own task body");
    assert_eq!(alone.message_id, "g");
}

/// An operator lifts a key's pause (a partner's bogus Retry-After) and a budget's: the next event
/// goes at once, each resume is audited with who and why, and lifting twice lifts nothing. (Events
/// given a slot behind the pause before it was lifted keep that slot: docs/operations.md.)
#[tokio::test]
async fn a_lifted_pause_lets_the_next_event_go_and_is_audited() {
    let (url, calls) = throttling_target(0).await;
    let l = limiter_forwarding_to(&url);
    let hook = [("event_type", "hook"), ("endpoint", "partner")];
    assert_eq!(l.push("r0", &hook, b"{}").await, StatusCode::NO_CONTENT);
    let bogus = serde_json::json!({ "rule": "hooks", "key": "endpoint_partner", "status": 429, "retryAfter": 99_999 });
    let (_, paused) = l.send("POST", "/v1/feedback", Some(bogus)).await;
    let paused_until = paused["pausedUntil"].as_str().unwrap().to_owned();

    let path = "/v1/rules/hooks/keys/endpoint_partner/pause";
    let (status, resumed) = l.send("DELETE", &format!("{path}?reason=INC-7%20bogus%20Retry-After"), None).await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["change"]["resumed_pause"].as_str(), Some(paused_until.as_str()), "{resumed}");
    assert_eq!((resumed["change"]["target"].as_str(), resumed["pausedUntil"].as_str()), (Some("key"), None));
    let (_, report) = l.send("GET", "/v1/rules/hooks/keys/endpoint_partner", None).await;
    assert!(report["pausedUntil"].is_null(), "inspect agrees: {report}");
    assert_eq!(l.push("r1", &hook, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!((*calls.lock().unwrap(), l.tasks().len()), (2, 0), "the next event goes at once, not after the pause");

    let (_, history) = l.send("GET", "/v1/rules/hooks/history?count=1", None).await;
    let entry = &history[0];
    assert_eq!(
        (entry["by"].as_str(), entry["reason"].as_str(), entry["resumed_pause"].as_str()),
        (Some("anonymous"), Some("INC-7 bogus Retry-After"), Some(paused_until.as_str())),
        "{history}"
    );
    assert!(parse_rfc3339(entry["at"].as_str().unwrap()).is_ok(), "{history}");
    let (status, again) = l.send("DELETE", path, None).await;
    assert_eq!(
        (status, again["change"]["resumed_pause"].is_null()),
        (StatusCode::OK, true),
        "nothing left to lift: {again}"
    );

    let budget = serde_json::json!({ "rule": "alerts", "budget": "partner", "status": 503, "retryAfter": 600 });
    assert_eq!(l.send("POST", "/v1/feedback", Some(budget)).await.0, StatusCode::OK);
    let alert = [("event_type", "alert"), ("tenant", "t")];
    assert_eq!(l.push("a0", &alert, b"{}").await, StatusCode::NO_CONTENT);
    assert!(l.published("alerts-ready").is_empty(), "the budget is paused");
    let (status, resumed) = l.send("DELETE", "/v1/rules/alerts/budgets/partner/pause", None).await;
    assert_eq!((status, resumed["change"]["target"].as_str()), (StatusCode::OK, Some("budget:partner")), "{resumed}");
    assert!(resumed["change"]["resumed_pause"].as_str().is_some(), "{resumed}");
    // Another tenant: t's own event holds its slot behind the lifted pause (FIFO per key).
    assert_eq!(l.push("a1", &[("event_type", "alert"), ("tenant", "u")], b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("alerts-ready").len(), 1, "the budget's next event goes at once");
    assert_eq!(l.send("DELETE", "/v1/rules/alerts/budgets/nope/pause", None).await.0, StatusCode::NOT_FOUND);
}

/// A field a person misspells is refused, naming it, and changes nothing: `untill` must not set a
/// limit with no end. A Retry-After of 0 pauses nothing (lifting a pause is DELETE .../pause).
#[tokio::test]
async fn unknown_fields_are_refused_naming_them_and_change_nothing() {
    let l = limiter();
    let path = "/v1/rules/payouts/keys/merchant_5/limits";
    let typo = serde_json::json!({ "limit": "5/1h", "untill": "2099-01-01T00:00:00Z" });
    let (status, body) = l.send("PUT", path, Some(typo)).await;
    assert!(status.is_client_error(), "{status}");
    assert!(body["error"]["message"].as_str().unwrap().contains("unknown field `untill`"), "{body}");
    assert_eq!(l.send("GET", path, None).await.1, serde_json::json!([]), "no override was set");
    let (status, body) = l.send("DELETE", &format!("{path}?per=1h&windw=fixed"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().unwrap().contains("windw"), "{body}");
    let snake = serde_json::json!({ "rule": "payouts", "key": "merchant_5", "status": 429, "retry_after": 60 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(snake)).await;
    assert!(
        status.is_client_error() && body["error"]["message"].as_str().unwrap().contains("retry_after"),
        "{status} {body}"
    );
    assert_eq!(l.send("GET", "/v1/rules/payouts/history?count=1&cuont=2", None).await.0, StatusCode::BAD_REQUEST);

    assert_eq!(l.payout("p0", 5).await, StatusCode::NO_CONTENT);
    let zero = serde_json::json!({ "rule": "payouts", "key": "merchant_5", "status": 429, "retryAfter": 0 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(zero)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "a wait of 0 s pauses nothing: {body}");
    let (_, report) = l.send("GET", "/v1/rules/payouts/keys/merchant_5", None).await;
    assert!(report["pausedUntil"].is_null(), "{report}");
}

/// The admin service runs the limiter with DRIP_ROUTES=admin,feedback: its ingress is open to
/// Google-authenticated callers, so /push must not be served there at all. The limiter in
/// production serves push and feedback, and no admin route.
#[tokio::test]
async fn each_instance_serves_only_the_route_classes_it_is_given() {
    let mut l = limiter();
    l.state.auth = drip_limiter::LimiterAuth::off().serving(drip_limiter::Routes {
        admin: true,
        feedback: true,
        ..drip_limiter::Routes::NONE
    });
    assert_eq!(l.payout("x", 1).await, StatusCode::NOT_FOUND, "no /push on the admin service");
    assert!(l.published("payouts-ready").is_empty() && l.tasks().is_empty());
    assert_eq!(l.send("GET", "/v1/rules/payouts/keys/merchant_1", None).await.0, StatusCode::OK);
    assert_eq!(l.send("DELETE", "/v1/rules/payouts/keys/merchant_1/pause", None).await.0, StatusCode::OK);
    // The feedback handler answers (it pauses a key it has not seen yet), where a route not
    // served answers an empty 404.
    let feedback = serde_json::json!({ "rule": "payouts", "key": "merchant_1", "status": 429, "retryAfter": 5 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(feedback.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["pausedUntil"].is_string(), "{body}");

    l.state.auth = drip_limiter::LimiterAuth::off().serving(drip_limiter::Routes {
        push: true,
        feedback: true,
        ..drip_limiter::Routes::NONE
    });
    assert_eq!(l.payout("y", 1).await, StatusCode::NO_CONTENT);
    assert_eq!(l.send("GET", "/v1/rules/payouts/keys/merchant_1", None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(l.send("DELETE", "/v1/rules/payouts/keys/merchant_1/pause", None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(l.send("POST", "/v1/feedback", Some(feedback)).await.0, StatusCode::OK, "merchant_1 now has state");
    assert_eq!(l.send("GET", "/console", None).await.0, StatusCode::NOT_FOUND, "no console on the limiter");

    // The console service behind IAP: the console, and no API route (IAP replaces the caller's
    // identity, so the API's ID tokens stay on the admin service).
    l.state.auth =
        drip_limiter::LimiterAuth::off().serving(drip_limiter::Routes { console: true, ..drip_limiter::Routes::NONE });
    assert_eq!(l.send("GET", "/console", None).await.0, StatusCode::OK);
    assert_eq!(l.send("GET", "/v1/rules/payouts/keys/merchant_1", None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(l.payout("z", 1).await, StatusCode::NOT_FOUND);
}

/// A push redelivered after the attempt that was to forward it died (its lease held the slot
/// meanwhile) comes after its slot's window: it takes the earliest slot that fits now, its old
/// one given back, instead of landing on the event that owns the window it comes in. Here the
/// window holds one event and has one already: the late event waits inline for the next window.
#[tokio::test]
async fn a_late_redelivery_waits_for_a_window_with_room() {
    let l = limiter();
    let now = drip_core::time::wall_clock_millis();
    let window = |t: i64| t.div_euclid(2 * SECOND);
    // Its first attempt reserved it 3 s ago (a window of its own) and died before forwarding.
    let past = now - 3 * SECOND;
    let published = drip_core::time::format_rfc3339(past);
    let attributes = [("event_type", "inline"), ("merchant", "8")];
    let owned: std::collections::BTreeMap<String, String> =
        attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let identity =
        drip_core::event::MessageRef::new("crashed".to_owned(), Some(SUBSCRIPTION.to_owned())).identity_with(&owned);
    let rule = l.state.rules.current().rule("inline").unwrap().clone();
    let filed = drip_core::event::filing_time(Some(&published), &owned);
    let request = drip_store::SlotRequest::for_rule(&rule, "merchant_8", &identity, 1).published(filed).at(past);
    let first = drip_store::Store::reserve(&*l.store, &request).await.unwrap().reservation;
    assert_eq!(first.slot, past);
    // The window now belongs to another event.
    assert_eq!(l.push("owner", &attributes, b"{}").await, StatusCode::NO_CONTENT);
    let body = drip_tests::push_envelope("crashed", SUBSCRIPTION, &published, &attributes, b"{}");
    assert_eq!(l.post("/push", body).await.0, StatusCode::NO_CONTENT);
    let at: Vec<(String, i64)> =
        l.published("inline-ready").iter().map(|p| (p.attributes["drip-message-id"].clone(), window(p.at))).collect();
    assert_eq!(at.len(), 2, "{at:?}");
    assert_ne!(at[0].1, at[1].1, "one event per 2 s window at the topic, the late one in the next: {at:?}");
}

/// A target that answers 200 with `X-Drip-Cost: <cost>`.
async fn costing_target(cost: u64) -> String {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move || async move { (StatusCode::OK, [("x-drip-cost", cost.to_string())]).into_response() },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Costs known only after the call: the forward URL's `X-Drip-Cost` and `POST /v1/feedback` with
/// the message's `drip-*` attributes each correct what the event booked, once per message, and
/// the window's count follows (here one booked unit became 40, then a report of 7 units for
/// another message that booked 1).
#[tokio::test]
async fn a_cost_reported_after_the_call_corrects_the_booking_once() {
    let l = limiter_forwarding_to(&costing_target(40).await);
    let hook = [("event_type", "hook"), ("endpoint", "llm")];
    assert_eq!(l.push("c1", &hook, b"{}").await, StatusCode::NO_CONTENT);
    let used = |l: &Limiter| match l.store.entity_state("hooks", "endpoint_llm").unwrap().limits.values().next() {
        Some(drip_core::schedule::LimitState::Fixed { used, .. }) => *used,
        other => panic!("{other:?}"),
    };
    assert_eq!(used(&l), 40, "the header's 40 units, not the one booked");
    // A consumer's report, naming the message as the forwarded one's attributes do.
    let l = limiter();
    let paced = [("event_type", "inline"), ("merchant", "5")];
    let published = drip_core::time::format_rfc3339(drip_core::time::wall_clock_millis());
    let body = drip_tests::push_envelope("c2", SUBSCRIPTION, &published, &paced, b"{}");
    assert_eq!(l.post("/push", body).await.0, StatusCode::NO_CONTENT);
    let forwarded = &l.published("inline-ready")[0];
    assert_eq!(forwarded.attributes["drip-published"], published, "what a consumer needs to report a cost");
    let report = serde_json::json!({
        "rule": "inline", "key": "merchant_5", "cost": 0,
        "messageId": forwarded.attributes["drip-message-id"],
        "subscription": forwarded.attributes["drip-subscription"],
        "published": forwarded.attributes["drip-published"],
    });
    let (status, answer) = l.send("POST", "/v1/feedback", Some(report.clone())).await;
    assert_eq!(
        (status, answer["outcome"].as_str(), answer["booked"].as_u64()),
        (StatusCode::OK, Some("applied"), Some(1))
    );
    let (status, answer) = l.send("POST", "/v1/feedback", Some(report)).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("already")),
        "a retried report changes nothing"
    );
    // The unit given back lets the next event go in the same 2 s window.
    assert_eq!(l.push("c3", &paced, b"{}").await, StatusCode::NO_CONTENT);
    assert_eq!(l.published("inline-ready").len(), 2);
    assert!(l.tasks().is_empty(), "no wait for the next window");
    let (_, history) = l.send("GET", "/v1/rules/inline/history", None).await;
    assert!(history.to_string().contains("\"actual\":0"), "audited: {history}");
}

/// A target that answers 204 after the delay (ms) the test sets.
async fn slowing_target() -> (String, Arc<std::sync::atomic::AtomicU64>) {
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(2));
    let set = delay.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let delay = set.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, delay)
}

/// Sleeps to just past the next whole second (the rule's adaptive window).
async fn next_window() {
    let now = drip_core::time::wall_clock_millis();
    tokio::time::sleep(Duration::from_millis((1_000 - now % 1_000 + 20) as u64)).await;
}

/// Latency as the leading signal: the forward URL's calls are timed; a window whose p90 is past
/// twice the baseline cuts the key's level (before any 429), shown by the entity endpoint and
/// the metrics; a consumer's window report through /v1/feedback is judged the same way.
#[tokio::test]
async fn a_slowing_forward_url_lowers_the_level_before_any_refusal() {
    let (url, delay) = slowing_target().await;
    let l = limiter_forwarding_to(&url);
    let hook = [("event_type", "slowhook"), ("endpoint", "p")];
    next_window().await;
    for i in 0..6 {
        assert_eq!(l.push(&format!("fast{i}"), &hook, b"{}").await, StatusCode::NO_CONTENT);
    }
    delay.store(100, std::sync::atomic::Ordering::Relaxed);
    next_window().await;
    // The first call of this window reports the fast one: the baseline. Five slow calls (the
    // fewest a window is judged on, MIN_CALLS) of 100 ms stay inside the window on a loaded
    // machine (six of 150 ms once crossed into the next).
    for i in 0..drip_service::latency::MIN_CALLS {
        assert_eq!(l.push(&format!("slow{i}"), &hook, b"{}").await, StatusCode::NO_CONTENT);
    }
    let (_, report) = l.send("GET", "/v1/rules/slowhooks/keys/endpoint_p", None).await;
    assert_eq!(report["adaptiveLevel"].as_f64(), Some(1.0), "a fast window changes nothing: {report}");
    let baseline = report["latency"]["baselineMs"].as_f64().expect("a baseline");
    assert!(baseline < 100.0, "{report}");
    next_window().await;
    assert_eq!(l.push("next", &hook, b"{}").await, StatusCode::NO_CONTENT);
    let (_, report) = l.send("GET", "/v1/rules/slowhooks/keys/endpoint_p", None).await;
    let level = report["adaptiveLevel"].as_f64().unwrap();
    assert!((0.5..1.0).contains(&level), "cut by at most half: {report}");
    assert_eq!(report["latency"]["levelThatHurt"].as_f64(), Some(1.0), "{report}");
    assert_eq!(report["limits"][0]["capacity"].as_u64(), Some((1000.0 * level) as u64), "{report}");
    let metrics = l.state.metrics.shared.render();
    assert!(
        metrics.contains("drip_latency_reports_total{target=\"rule:slowhooks\",verdict=\"slow\",shadow=\"false\"} 1"),
        "{metrics}"
    );

    // A consumer's own window: 90 calls at p99 40 ms on another key sets its baseline, a later
    // window at 400 ms is slow; a second report in that window changes nothing.
    let window =
        |ms: f64| serde_json::json!({ "rule": "slowhooks", "key": "endpoint_q", "latencyMs": ms, "calls": 900 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(window(40.0))).await;
    assert_eq!((status, body["latency"].as_str()), (StatusCode::OK, Some("judged")), "{body}");
    next_window().await;
    let (_, body) = l.send("POST", "/v1/feedback", Some(window(400.0))).await;
    assert_eq!((body["verdict"].as_str(), body["level"].as_f64()), (Some("slow"), Some(0.5)), "{body}");
    let (_, body) = l.send("POST", "/v1/feedback", Some(window(4000.0))).await;
    assert_eq!((body["verdict"].as_str(), body["level"].as_f64()), (Some("repeat"), Some(0.5)), "{body}");
    let (status, body) = l
        .send("POST", "/v1/feedback", Some(serde_json::json!({ "rule": "hooks", "key": "endpoint_q", "latencyMs": 5 })))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a rule without latency control says so: {body}");
}

/// An operator pauses a merchant Drip has not seen yet (the runbook's first step in an outage),
/// and its first event waits for the pause; a pause longer than the rule's `max_pause` is cut to
/// it, and the answer says so, with what was asked.
#[tokio::test]
async fn a_key_not_seen_yet_can_be_paused_and_a_capped_pause_says_so() {
    let l = limiter();
    let pause = serde_json::json!({ "rule": "payouts", "key": "merchant_42", "status": 503, "retryAfter": 30 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(pause)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["askedUntil"].is_null(), "30 s is within max_pause: {body}");
    let (_, report) = l.send("GET", "/v1/rules/payouts/keys/merchant_42", None).await;
    assert_eq!(report["pausedUntil"], body["pausedUntil"], "{report}");
    assert_eq!(l.payout("first", 42).await, StatusCode::NO_CONTENT);
    assert!(l.published("payouts-ready").is_empty(), "the first event waits for the pause");

    let long = serde_json::json!({ "rule": "payouts", "key": "merchant_43", "status": 429, "retryAfter": 999_999 });
    let (status, body) = l.send("POST", "/v1/feedback", Some(long)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (paused, asked) = (body["pausedUntil"].as_str().unwrap(), body["askedUntil"].as_str().expect("capped"));
    assert!(paused < asked, "{body}");
    assert!(body["maxPause"].is_string(), "{body}");
}
