//! The dispatcher's app driven in process with `tower::ServiceExt::oneshot`: the reference model
//! (`MemoryStore`) as the store and a recording double for Pub/Sub. Milliseconds per case, no
//! services; what only the real parts show (Cloud Tasks' retries, Redis, the emulator) stays in
//! `tests/tests/dispatcher.rs` and the end-to-end tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use drip_core::overflow::{RateLimitMeta, SIGNATURE_HEADER, TaskBody, TaskPayload, TaskSeal, TaskSigner};
use drip_core::rules::{RuleSet, ServiceRules};
use drip_core::time::{HOUR, Millis, SECOND, format_rfc3339, wall_clock_millis};
use drip_dispatcher::{AppState, app};
use drip_gcp::http_target::{HttpTarget, IdTokenMode};
use drip_gcp::pubsub::PublishError;
use drip_gcp::{GcpFuture, Publish};
use drip_service::auth::RouteAuth;
use drip_service::metrics::ServiceMetrics;
use drip_store::MemoryStore;
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
    forward: { topic: payouts-ready }
    overflow_topic: payouts-overflow
"#;

#[derive(Debug, Default)]
struct RecordingPublisher {
    published: Mutex<Vec<(String, Vec<u8>)>>,
}

impl Publish for RecordingPublisher {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        _: BTreeMap<String, String>,
    ) -> GcpFuture<'a, String, PublishError> {
        let mut published = self.published.lock().unwrap();
        published.push((topic.to_owned(), data));
        let id = published.len().to_string();
        Box::pin(async move { Ok(id) })
    }
}

struct Dispatcher {
    state: AppState,
    pubsub: Arc<RecordingPublisher>,
}

fn dispatcher() -> Dispatcher {
    let rules = ServiceRules::new(RuleSet::parse("handlers.yaml", RULES).unwrap(), "handlers.yaml").unwrap();
    let metrics = Arc::new(ServiceMetrics::new(("dispatches", "-"), ("dispatch_lateness_seconds", "-")));
    let pubsub = Arc::new(RecordingPublisher::default());
    let state = AppState {
        rules: drip_service::live_rules::LiveRules::fixed(rules, metrics.shared.clone()),
        store: Arc::new(MemoryStore::new()),
        publishers: pubsub.clone(),
        auth: (RouteAuth::off(), RouteAuth::off()),
        metrics,
        signer: TaskSigner::new(KEY),
        max_attempts: 100,
        lease: 10_000,
        target: Arc::new(HttpTarget::new(Duration::from_secs(1), IdTokenMode::Never).unwrap()),
        tasks: None,
        early_tolerance: SECOND,
        accept_unsigned_until: None,
    };
    Dispatcher { state, pubsub }
}

/// The body of a task for message `id`, due at `slot`, carrying `amount`.
fn task(id: &str, slot: Millis, amount: u64) -> Vec<u8> {
    let body = TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: "merchant_7".into(),
            rule: "payouts".into(),
            rule_id: None,
            window_type: "RPS".into(),
            limit: 1,
            scheduled_for: format_rfc3339(slot),
            overflow_topic: "payouts-overflow".into(),
            cost: None,
        },
        payload: TaskPayload::inline(format!(r#"{{"amount":{amount}}}"#).as_bytes()),
        attributes: BTreeMap::from([("event_type".into(), "payout".into())]),
        message_id: id.into(),
        subscription: Some("projects/p/subscriptions/source".into()),
        publish_time: None,
    };
    serde_json::to_vec(&body).unwrap()
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

    fn published(&self) -> Vec<(String, String)> {
        let published = self.pubsub.published.lock().unwrap();
        published.iter().map(|(topic, data)| (topic.clone(), String::from_utf8_lossy(data).into_owned())).collect()
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
