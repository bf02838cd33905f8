//! The limiter's app driven in process with `tower::ServiceExt::oneshot`: the reference model as
//! the store, and recording doubles for Pub/Sub and Cloud Tasks. Milliseconds per case, no services;
//! what only the real parts can show (the emulator's redelivery, the stand-in's scheduling, Redis)
//! stays in `tests/tests/limiter.rs` and the end-to-end tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use drip_core::overflow::{SIGNATURE_HEADER, TaskBody, TaskPayload, TaskSigner};
use drip_core::rules::{RuleSet, ServiceRules};
use drip_core::time::parse_rfc3339;
use drip_gcp::pubsub::PublishError;
use drip_gcp::tasks::{CreateTaskError, Created};
use drip_gcp::{CreateTask, GcpFuture, Publish};
use drip_limiter::{AppState, ForwardIdToken, ForwardIdTokenMode, app, task_id};
use drip_service::metrics::ServiceMetrics;
use drip_store::MemoryLimiterStore;
use drip_tests::stack::SIGNING_KEY;
use tower::ServiceExt;

const SUBSCRIPTION: &str = "projects/drip-test/subscriptions/payouts-push";
const QUEUE: &str = "projects/drip-test/locations/local/queues/q0";

const RULES: &str = r#"
default_dlq_topic: drip-dlq
rules:
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant_id}"
    limits: [ { limit: 2, per: 1h, window: fixed } ]
    max_delay: 1h
    inline_wait: 0s
    forward: { topic: payouts-ready }
    overflow_topic: payouts-overflow
    dlq_topic: payouts-dlq
"#;

#[derive(Debug, Clone)]
struct Published {
    topic: String,
    data: Vec<u8>,
    attributes: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct RecordingPublisher {
    published: Mutex<Vec<Published>>,
    /// Topics whose publishes time out.
    failing: Mutex<Vec<String>>,
}

impl Publish for RecordingPublisher {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> GcpFuture<'a, String, PublishError> {
        let result = if self.failing.lock().unwrap().iter().any(|t| t == topic) {
            Err(PublishError::TimedOut { topic: topic.to_owned(), timeout: Duration::from_secs(1) })
        } else {
            let mut published = self.published.lock().unwrap();
            published.push(Published { topic: topic.to_owned(), data, attributes });
            Ok(published.len().to_string())
        };
        Box::pin(async move { result })
    }
}

#[derive(Debug, Clone)]
struct CreatedTask {
    queue: String,
    id: String,
    at: i64,
    body: Vec<u8>,
    headers: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct RecordingTasks {
    created: Mutex<Vec<CreatedTask>>,
    /// Cloud Tasks refuses every task as INVALID_ARGUMENT.
    refuse: Mutex<bool>,
}

impl CreateTask for RecordingTasks {
    fn create<'a>(
        &'a self,
        queue: &'a str,
        task_id: &'a str,
        schedule_time: i64,
        body: Vec<u8>,
        headers: HashMap<String, String>,
    ) -> GcpFuture<'a, Created, CreateTaskError> {
        let result = if *self.refuse.lock().unwrap() {
            let status = google_cloud_gax::error::rpc::Status::default()
                .set_code(google_cloud_gax::error::rpc::Code::InvalidArgument)
                .set_message("the task is invalid");
            Err(CreateTaskError { name: task_id.to_owned(), source: google_cloud_gax::error::Error::service(status) })
        } else {
            let mut created = self.created.lock().unwrap();
            if created.iter().any(|t| t.id == task_id) {
                Ok(Created::AlreadyExisted)
            } else {
                let task = CreatedTask { queue: queue.into(), id: task_id.into(), at: schedule_time, body, headers };
                created.push(task);
                Ok(Created::New)
            }
        };
        Box::pin(async move { result })
    }
}

struct Limiter {
    state: AppState,
    store: Arc<MemoryLimiterStore>,
    pubsub: Arc<RecordingPublisher>,
    tasks: Arc<RecordingTasks>,
}

fn limiter() -> Limiter {
    let rules = ServiceRules::new(RuleSet::parse("handlers.yaml", RULES).unwrap(), "handlers.yaml").unwrap();
    let (store, pubsub, tasks) = (
        Arc::new(MemoryLimiterStore::new()),
        Arc::new(RecordingPublisher::default()),
        Arc::new(RecordingTasks::default()),
    );
    let metrics = Arc::new(ServiceMetrics::new(("decisions", "-"), ("delay_seconds", "-")));
    let state = AppState {
        rules: drip_service::live_rules::LiveRules::fixed(rules, metrics.shared.clone()),
        store: store.clone(),
        publishers: pubsub.clone(),
        tasks: tasks.clone(),
        queues: Arc::new(vec![QUEUE.to_owned()]),
        http: reqwest::Client::new(),
        id_tokens: Arc::new(ForwardIdToken::new(ForwardIdTokenMode::Never)),
        oidc: None,
        metrics,
        claim_check_max_bytes: 4 * 1024 * 1024,
        signer: TaskSigner::new(SIGNING_KEY),
        attempt_deadline: Duration::from_secs(5),
        lease: 10_000,
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
        assert_eq!(task.id, task_id("payouts", &identity));
        assert!(TaskSigner::new(SIGNING_KEY).verify(&task.body, &task.headers[SIGNATURE_HEADER]), "signed");
        let body: TaskBody = serde_json::from_slice(&task.body).unwrap();
        assert_eq!(body.message_id, id);
        assert_eq!(parse_rfc3339(&body.rate_limit_meta.scheduled_for), Ok(next_window));
        assert_eq!(body.payload.data().unwrap(), br#"{"merchant_id":7}"#);
    }
    let dead = l.published("payouts-dlq");
    assert_eq!(dead.len(), 2, "e and f would wait past the next window: more than max_delay (1h)");
    assert!(dead.iter().all(|d| d.attributes["drip-reason"] == "max_delay_exceeded"));
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
    let state = l.store.model.entity_state("payouts", "merchant_3").unwrap();
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
    assert_eq!(l.store.payload(reference).as_deref(), Some(big.as_bytes()));
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
