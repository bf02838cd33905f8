//! The dispatcher against a real Redis and the Pub/Sub emulator: publishes the overflow message
//! only to a configured rule's topic, only once per task, with the payload inline or claim-checked.

use std::collections::BTreeMap;
use std::time::Duration;

use cloud_tasks_emulator::TokenSigner;
use drip_core::overflow::{RateLimitMeta, TaskBody};
use drip_tests::pubsub_emulator::{Pubsub, PubsubEmulator};
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{DispatcherUnderTest, TasksStandIn, spawn_dispatcher};
use drip_tests::unique;
use reqwest::StatusCode;
use serde_json::Value;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant_id}"
    limits: [{ limit: 1, per: 1s }]
    max_delay: 1h
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
  - name: {p}-kyc
    match: { attributes: { event_type: kyc } }
    key: "{attributes.partner}"
    limits: [{ limit: 1, per: 1s }]
    max_delay: 1h
    forward: { topic: {p}-ready }
    overflow_topic: {p}-kyc-overflow
    overflow_format: original
"#;

struct Test {
    prefix: String,
    pubsub: Pubsub,
    dispatcher: DispatcherUnderTest,
    http: reqwest::Client,
}

async fn start_with(pubsub: Pubsub, oidc: Option<(&str, &str, &str)>) -> Test {
    let prefix = unique("dis");
    for topic in ["ready", "overflow", "kyc-overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = RULES.replace("{p}", &prefix);
    let dispatcher = spawn_dispatcher(&rules, &shared_url(), &unique("drip"), &pubsub.host, oidc).await;
    Test { prefix, pubsub, dispatcher, http: reqwest::Client::new() }
}

fn task_body(prefix: &str, rule: &str, topic: &str, id: &str, data: &[u8]) -> TaskBody {
    TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: "merchant_8421".into(),
            rule: format!("{prefix}-{rule}"),
            window_type: "RPS".into(),
            limit: 1,
            scheduled_for: drip_core::time::format_rfc3339(
                drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() - 250,
            ),
            overflow_topic: format!("{prefix}-{topic}"),
        },
        original_payload: None,
        original_payload_base64: None,
        claim_check: None,
        attributes: BTreeMap::from([("event_type".into(), "payout".into())]),
        message_id: id.into(),
        publish_time: None,
    }
    .with_data(data)
}

impl Test {
    async fn dispatch(&self, body: &[u8], task_headers: bool, token: Option<&str>) -> StatusCode {
        let mut request = self.http.post(format!("{}/dispatch", self.dispatcher.url)).body(body.to_vec());
        if task_headers {
            request = request
                .header("X-CloudTasks-QueueName", "drip-0")
                .header("X-CloudTasks-TaskName", "abc-payouts")
                .header("X-CloudTasks-TaskRetryCount", "0");
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap().status()
    }

    async fn pulled(&self, topic: &str, count: usize) -> Vec<drip_tests::pubsub_emulator::Pulled> {
        self.pubsub.pull_until(&format!("{}-{topic}", self.prefix), count, Duration::from_secs(10)).await
    }
}

#[tokio::test]
async fn publishes_the_enriched_event_with_its_attributes_once() {
    let t = start_with(Pubsub::shared(), None).await;
    let body = task_body(&t.prefix, "payouts", "overflow", "m1", br#"{"payoutId":"pay_1","amount":2500.00}"#);
    let encoded = serde_json::to_vec(&body).unwrap();
    assert_eq!(t.dispatch(&encoded, true, None).await, StatusCode::OK);
    assert_eq!(t.dispatch(&encoded, true, None).await, StatusCode::OK, "a second dispatch of the same task");
    let mut published = t.pulled("overflow", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    published.extend(t.pubsub.pull(&format!("{}-overflow", t.prefix), 10).await);
    assert_eq!(published.len(), 1, "published once");
    let message = &published[0];
    assert_eq!(message.attributes["isRatelimited"], "true");
    assert_eq!(message.attributes["drip-message-id"], "m1");
    assert_eq!(message.attributes["drip-rule"], format!("{}-payouts", t.prefix));
    assert_eq!(message.attributes["drip-key"], "merchant_8421");
    assert_eq!(message.attributes["drip-scheduled-for"], body.rate_limit_meta.scheduled_for);
    assert_eq!(message.attributes["event_type"], "payout");
    let enriched: Value = serde_json::from_slice(&message.data).unwrap();
    assert_eq!(enriched["isRatelimited"], true);
    assert_eq!(enriched["rateLimitMeta"]["overflowTopic"], format!("{}-overflow", t.prefix));
    assert!(
        String::from_utf8_lossy(&message.data).contains(r#""originalPayload":{"payoutId":"pay_1","amount":2500.00}"#)
    );
    let metrics = t.http.get(format!("{}/metrics", t.dispatcher.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("drip_dispatch_lateness_seconds_count"), "{metrics}");
    assert!(metrics.contains(r#"outcome="duplicate"} 1"#), "{metrics}");
}

#[tokio::test]
async fn the_original_format_publishes_the_data_as_it_came() {
    let t = start_with(Pubsub::shared(), None).await;
    let body = task_body(&t.prefix, "kyc", "kyc-overflow", "k1", b"\x00binary\xff");
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::OK);
    let published = t.pulled("kyc-overflow", 1).await;
    assert_eq!(published[0].data, b"\x00binary\xff");
    assert_eq!(published[0].attributes["drip-message-id"], "k1");
}

#[tokio::test]
async fn refuses_topics_no_rule_owns_and_requests_not_from_cloud_tasks() {
    let t = start_with(Pubsub::shared(), None).await;
    let mut body = task_body(&t.prefix, "payouts", "overflow", "x1", b"{}");
    body.rate_limit_meta.overflow_topic = format!("{}-ready", t.prefix);
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::FORBIDDEN);
    body.rate_limit_meta.overflow_topic = "projects/victim/topics/anything".into();
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::FORBIDDEN);
    let good = task_body(&t.prefix, "payouts", "overflow", "x2", b"{}");
    assert_eq!(t.dispatch(&serde_json::to_vec(&good).unwrap(), false, None).await, StatusCode::FORBIDDEN);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.pubsub.pull(&format!("{}-ready", t.prefix), 10).await.is_empty());
    assert!(t.pubsub.pull(&format!("{}-overflow", t.prefix), 10).await.is_empty());
}

#[tokio::test]
async fn claim_checked_payloads_are_fetched_and_missing_ones_dead_lettered() {
    let t = start_with(Pubsub::shared(), None).await;
    let mut redis = t.dispatcher.state.redis.clone();
    let data = vec![b'z'; 150 * 1024];
    let reference = drip_store::claim_check::claim_check_key(
        &t.dispatcher.state.namespace,
        &format!("{}-kyc", t.prefix),
        "merchant_8421",
        "c1",
    );
    drip_store::claim_check::put(&mut redis, &reference, &data, 60_000).await.unwrap();
    let mut body = task_body(&t.prefix, "kyc", "kyc-overflow", "c1", b"");
    body.original_payload_base64 = None;
    body.claim_check = Some(reference);
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::OK);
    assert_eq!(t.pulled("kyc-overflow", 1).await[0].data, data);

    let mut gone = task_body(&t.prefix, "kyc", "kyc-overflow", "c2", b"");
    gone.original_payload_base64 = None;
    gone.claim_check = Some("drip:{nothing|here}:payload:c2".into());
    assert_eq!(t.dispatch(&serde_json::to_vec(&gone).unwrap(), true, None).await, StatusCode::OK);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "claim_check_missing");
    assert_eq!(dead[0].attributes["drip-message-id"], "c2");
}

#[tokio::test]
async fn a_malformed_task_is_dead_lettered_not_retried_forever() {
    let t = start_with(Pubsub::shared(), None).await;
    assert_eq!(t.dispatch(b"{\"not\":\"a task\"}", true, None).await, StatusCode::OK);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "malformed_task");
    assert_eq!(dead[0].data, b"{\"not\":\"a task\"}");
}

#[tokio::test]
async fn pubsub_down_means_5xx_so_cloud_tasks_retries() {
    let mut t = start_with(Pubsub::own(PubsubEmulator::start()), None).await;
    t.pubsub.emulator().unwrap().stop();
    let body = task_body(&t.prefix, "payouts", "overflow", "p1", b"{}");
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn oidc_tokens_are_required_when_enabled() {
    let jwks_source = TasksStandIn::start().await;
    let jwks = jwks_source.client.jwks_url();
    let email = "drip-tasks@drip-test.iam.gserviceaccount.com";
    let t = start_with(Pubsub::shared(), Some(("https://dispatcher.example", email, &jwks))).await;
    let body = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "o1", b"{}")).unwrap();
    assert_eq!(t.dispatch(&body, true, None).await, StatusCode::UNAUTHORIZED);
    let now = drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() / 1_000;
    let stranger =
        TokenSigner::test_key().sign("someone@else.iam.gserviceaccount.com", "https://dispatcher.example", now, 600);
    assert_eq!(t.dispatch(&body, true, Some(&stranger)).await, StatusCode::FORBIDDEN);
    let token = TokenSigner::test_key().sign(email, "https://dispatcher.example", now, 600);
    assert_eq!(t.dispatch(&body, true, Some(&token)).await, StatusCode::OK);
}
