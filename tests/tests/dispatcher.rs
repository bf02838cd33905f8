//! The dispatcher against a real Redis and the Pub/Sub emulator: publishes the overflow message
//! only to a configured rule's topic, only once per task, with the payload inline or claim-checked.

use std::collections::BTreeMap;
use std::time::Duration;

use cloud_tasks_emulator::TokenSigner;
use drip_core::overflow::{RateLimitMeta, SIGNATURE_HEADER, TaskBody, TaskPayload, TaskSeal, TaskSigner};
use drip_core::time::{HOUR, Millis, wall_clock_millis};
use drip_tests::pubsub_emulator::{Pubsub, PubsubEmulator};
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{
    DispatcherUnderTest, SIGNING_KEY, TasksStandIn, spawn_dispatcher_accepting_unsigned, spawn_dispatcher_with,
};
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
    start_full(pubsub, oidc, 100, &["ready", "overflow", "kyc-overflow", "dlq"]).await
}

/// A dispatcher for queues of `max_attempts`, with only `topics` created in the emulator.
async fn start_full(pubsub: Pubsub, oidc: Option<(&str, &str, &str)>, max_attempts: i64, topics: &[&str]) -> Test {
    let prefix = unique("dis");
    for topic in topics {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = RULES.replace("{p}", &prefix);
    let dispatcher =
        spawn_dispatcher_with(&rules, &shared_url(), &unique("drip"), &pubsub.host, oidc, max_attempts).await;
    Test { prefix, pubsub, dispatcher, http: reqwest::Client::new() }
}

fn task_body(prefix: &str, rule: &str, topic: &str, id: &str, data: &[u8]) -> TaskBody {
    TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: "merchant_8421".into(),
            rule: format!("{prefix}-{rule}"),
            rule_id: None,
            window_type: "RPS".into(),
            limit: 1,
            scheduled_for: drip_core::time::system_time_to_millis(std::time::SystemTime::now()).unwrap() - 250,
            overflow_topic: format!("{prefix}-{topic}"),
            cost: None,
        },
        payload: TaskPayload::inline(data),
        attributes: BTreeMap::from([("event_type".into(), "payout".into())]),
        message_id: id.into(),
        subscription: Some("projects/drip-test/subscriptions/source".into()),
        publish_time: None,
    }
}

/// The task name the tests' requests carry (`X-CloudTasks-TaskName`).
const TASK_NAME: &str = "abc-payouts";

/// The limiter's seal for `body` as task [`TASK_NAME`]: at the body's slot (now for a body that is
/// not a task), expiring an hour later.
fn seal(body: &[u8]) -> String {
    let slot = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["rateLimitMeta"]["scheduledFor"].as_str().map(str::to_owned))
        .and_then(|at| drip_core::time::parse_rfc3339(&at).ok())
        .unwrap_or_else(wall_clock_millis);
    seal_as(SIGNING_KEY, TASK_NAME, slot, slot + HOUR, body)
}

fn seal_as(key: &str, name: &str, slot: Millis, expires: Millis, body: &[u8]) -> String {
    TaskSigner::new(key).sign(&TaskSeal { name, slot, expires }, body)
}

/// A signature over the body alone, as versions before sealed tasks made them.
fn body_only_signature(body: &[u8]) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SIGNING_KEY.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

impl Test {
    /// As Cloud Tasks would run a task the limiter sealed (`task_headers`: with Cloud Tasks' headers).
    async fn dispatch(&self, body: &[u8], task_headers: bool, token: Option<&str>) -> StatusCode {
        self.send(body, task_headers, token, Some(seal(body)), 0).await
    }

    async fn dispatch_unsigned(&self, body: &[u8]) -> StatusCode {
        self.send(body, true, None, None, 0).await
    }

    /// As Cloud Tasks would run a task the limiter sealed, on attempt `retry_count + 1`.
    async fn dispatch_signed(&self, body: &[u8], retry_count: u32) -> StatusCode {
        self.send(body, true, None, Some(seal(body)), retry_count).await
    }

    async fn send(
        &self,
        body: &[u8],
        task_headers: bool,
        token: Option<&str>,
        signature: Option<String>,
        retry_count: u32,
    ) -> StatusCode {
        let mut request = self.http.post(format!("{}/dispatch", self.dispatcher.url)).body(body.to_vec());
        if task_headers {
            request = request
                .header("X-CloudTasks-QueueName", "drip-0")
                .header("X-CloudTasks-TaskName", TASK_NAME)
                .header("X-CloudTasks-TaskRetryCount", retry_count.to_string());
        }
        if let Some(signature) = signature {
            request = request.header(SIGNATURE_HEADER, signature);
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
    assert_eq!(
        message.attributes["drip-scheduled-for"],
        drip_core::time::format_rfc3339(body.rate_limit_meta.scheduled_for)
    );
    assert_eq!(message.attributes["event_type"], "payout");
    let enriched: Value = serde_json::from_slice(&message.data).unwrap();
    let schema = drip_core::overflow::schema();
    let errors: Vec<String> =
        jsonschema::validator_for(&schema).unwrap().iter_errors(&enriched).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "the message fits `drip schema overflow`: {errors:?}");
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
    assert_eq!(t.dispatch_unsigned(&serde_json::to_vec(&body).unwrap()).await, StatusCode::FORBIDDEN);
    body.rate_limit_meta.overflow_topic = "projects/victim/topics/anything".into();
    assert_eq!(t.dispatch_unsigned(&serde_json::to_vec(&body).unwrap()).await, StatusCode::FORBIDDEN);
    let good = task_body(&t.prefix, "payouts", "overflow", "x2", b"{}");
    assert_eq!(t.dispatch(&serde_json::to_vec(&good).unwrap(), false, None).await, StatusCode::FORBIDDEN);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.pubsub.pull(&format!("{}-ready", t.prefix), 10).await.is_empty());
    assert!(t.pubsub.pull(&format!("{}-overflow", t.prefix), 10).await.is_empty());
}

#[tokio::test]
async fn claim_checked_payloads_are_fetched_and_missing_ones_dead_lettered() {
    let t = start_with(Pubsub::shared(), None).await;
    let store = &t.dispatcher.state.store;
    let data = vec![b'z'; 150 * 1024];
    let mut body = task_body(&t.prefix, "kyc", "kyc-overflow", "c1", b"");
    let identity = drip_core::event::MessageRef::new("c1", body.subscription.clone()).identity();
    let rule = format!("{}-kyc", t.prefix);
    let of = drip_store::MessageOf { rule: &rule, key: "merchant_8421", message: &identity };
    let reference = store.put_payload(of, &data, 60_000).await.unwrap();
    body.payload = TaskPayload::ClaimCheck(reference.clone());
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::OK);
    assert_eq!(t.pulled("kyc-overflow", 1).await[0].data, data);
    assert_eq!(store.get_payload(&reference).await.unwrap(), None, "deleted once published");

    let mut gone = task_body(&t.prefix, "kyc", "kyc-overflow", "c2", b"");
    gone.payload = TaskPayload::ClaimCheck("drip:{nothing|here}:p:c2".into());
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

    // The slot travels as a time: a task whose slot is not one is malformed, and says which field.
    let mut body = serde_json::to_value(task_body(&t.prefix, "payouts", "overflow", "s1", b"{}")).unwrap();
    body["rateLimitMeta"]["scheduledFor"] = "next tuesday".into();
    assert_eq!(t.dispatch(&serde_json::to_vec(&body).unwrap(), true, None).await, StatusCode::OK);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "malformed_task");
    assert!(
        dead[0].attributes["drip-detail"].contains("'next tuesday'"),
        "the detail names the value: {:?}",
        dead[0].attributes
    );
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

#[tokio::test]
async fn a_signed_task_whose_overflow_topic_was_retired_is_dead_lettered_not_refused() {
    let t = start_with(Pubsub::shared(), None).await;
    // Its rule changed its overflow topic while it waited: the rule's topic now.
    let mut moved = task_body(&t.prefix, "payouts", "overflow", "r0", br#"{"payoutId":"pay_8"}"#);
    moved.rate_limit_meta.overflow_topic = format!("{}-old-overflow", t.prefix);
    assert_eq!(t.dispatch_signed(&serde_json::to_vec(&moved).unwrap(), 0).await, StatusCode::OK);
    let published = t.pulled("overflow", 1).await;
    assert_eq!(published[0].attributes["drip-message-id"], "r0");

    // Its rule is gone: dead-lettered.
    let mut body = task_body(&t.prefix, "removed-rule", "overflow", "r1", br#"{"payoutId":"pay_9"}"#);
    body.rate_limit_meta.overflow_topic = format!("{}-old-overflow", t.prefix);
    let encoded = serde_json::to_vec(&body).unwrap();
    assert_eq!(t.dispatch_unsigned(&encoded).await, StatusCode::FORBIDDEN, "unsigned: refused, never relayed");
    let mut forged = encoded.clone();
    forged.extend(b" ");
    assert_eq!(t.send(&forged, true, None, Some(seal(&encoded)), 0).await, StatusCode::FORBIDDEN, "another body");
    let slot = wall_clock_millis();
    let other_key = seal_as("another-key-another-key-another-key", TASK_NAME, slot, slot + HOUR, &encoded);
    assert_eq!(t.send(&encoded, true, None, Some(other_key), 0).await, StatusCode::FORBIDDEN, "another key");

    assert_eq!(t.dispatch_signed(&encoded, 0).await, StatusCode::OK);
    assert_eq!(t.dispatch_signed(&encoded, 1).await, StatusCode::OK, "a second run");
    let mut dead = t.pulled("dlq", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    dead.extend(t.pubsub.pull(&format!("{}-dlq", t.prefix), 10).await);
    assert_eq!(dead.len(), 1, "dead-lettered once");
    assert_eq!(dead[0].attributes["drip-reason"], "overflow_topic_retired");
    assert_eq!(dead[0].attributes["drip-message-id"], "r1");
    assert_eq!(dead[0].attributes["drip-subscription"], "projects/drip-test/subscriptions/source");
    assert_eq!(dead[0].attributes["event_type"], "payout");
    assert!(dead[0].attributes["drip-detail"].contains("old-overflow"));
    assert_eq!(dead[0].data, br#"{"payoutId":"pay_9"}"#, "the event's data, not the task body");
}

#[tokio::test]
async fn a_task_failing_on_the_queue_s_last_attempt_is_dead_lettered_not_deleted() {
    // The overflow topic does not exist: every publish fails, as with missing publish rights.
    let t = start_full(Pubsub::shared(), None, 3, &["dlq"]).await;
    let body = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "f1", b"{\"a\":1}")).unwrap();
    assert_eq!(t.dispatch_signed(&body, 0).await, StatusCode::SERVICE_UNAVAILABLE, "attempt 1 of 3");
    assert_eq!(t.dispatch_signed(&body, 1).await, StatusCode::SERVICE_UNAVAILABLE, "attempt 2 of 3");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(t.pubsub.pull(&format!("{}-dlq", t.prefix), 10).await.is_empty(), "nothing dead-lettered before the last");
    assert_eq!(t.dispatch_signed(&body, 2).await, StatusCode::OK, "attempt 3 of 3");
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "dispatch_failed");
    assert_eq!(dead[0].attributes["drip-task"], "abc-payouts");
    assert!(dead[0].attributes["drip-detail"].starts_with("attempt 3 of 3"), "{}", dead[0].attributes["drip-detail"]);
    assert_eq!(dead[0].data, b"{\"a\":1}");
}

#[tokio::test]
async fn overflow_attributes_over_pubsub_s_limits_are_dead_lettered_with_the_reason() {
    let t = start_with(Pubsub::shared(), None).await;
    let mut body = task_body(&t.prefix, "payouts", "overflow", "a1", b"{}");
    body.attributes = (0..99).map(|i| (format!("attr{i}"), "v".to_owned())).collect();
    assert_eq!(t.dispatch_signed(&serde_json::to_vec(&body).unwrap(), 0).await, StatusCode::OK);
    let dead = t.pulled("dlq", 1).await;
    assert_eq!(dead[0].attributes["drip-reason"], "attributes_over_limit");
    assert_eq!(dead[0].attributes["drip-wrapped"], "json");
    let wrapped: Value = serde_json::from_slice(&dead[0].data).unwrap();
    assert_eq!(wrapped["attributes"].as_object().unwrap().len(), 99, "no attribute lost");
}

/// What an attacker who can create tasks (or read one) can try: an unsigned copy with another
/// amount, an invented message, a signed body under another name or before its slot, a replay
/// after its expiry. None is published; the real task still is, once.
#[tokio::test]
async fn only_the_limiter_s_sealed_task_is_published_at_its_slot_and_once() {
    let t = start_with(Pubsub::shared(), None).await;
    let slot = wall_clock_millis() + 6_000;
    let mut real = task_body(&t.prefix, "payouts", "overflow", "s1", br#"{"amount":10}"#);
    real.rate_limit_meta.scheduled_for = slot;
    let encoded = serde_json::to_vec(&real).unwrap();
    let sealed = seal_as(SIGNING_KEY, TASK_NAME, slot, slot + HOUR, &encoded);

    let forged = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "s1", br#"{"amount":9999}"#)).unwrap();
    assert_eq!(t.dispatch_unsigned(&forged).await, StatusCode::FORBIDDEN, "an unsigned copy, amount changed");
    let invented = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "made-up", b"{}")).unwrap();
    assert_eq!(t.dispatch_unsigned(&invented).await, StatusCode::FORBIDDEN, "an invented message");
    assert_eq!(
        t.send(&encoded, true, None, Some(body_only_signature(&encoded)), 0).await,
        StatusCode::FORBIDDEN,
        "a body-only signature outside the upgrade window"
    );
    let mut other_name = t.http.post(format!("{}/dispatch", t.dispatcher.url)).body(encoded.clone());
    other_name = other_name
        .header("X-CloudTasks-QueueName", "drip-0")
        .header("X-CloudTasks-TaskName", "copied-under-another-name")
        .header(SIGNATURE_HEADER, &sealed);
    assert_eq!(other_name.send().await.unwrap().status(), StatusCode::FORBIDDEN, "the seal names its task");
    assert_eq!(
        t.send(&encoded, true, None, Some(sealed.clone()), 0).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "6 s before its slot: Cloud Tasks tries again later"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.pubsub.pull(&format!("{}-overflow", t.prefix), 10).await.is_empty(), "nothing published early");

    let expired = seal_as(SIGNING_KEY, TASK_NAME, slot - 2 * HOUR, slot - HOUR, &encoded);
    assert_eq!(t.send(&encoded, true, None, Some(expired), 0).await, StatusCode::FORBIDDEN, "past its expiry");

    // Within the early tolerance (1 s) the dispatcher waits for the slot.
    let soon = wall_clock_millis() + 700;
    let mut due = task_body(&t.prefix, "payouts", "overflow", "s2", br#"{"amount":10}"#);
    due.rate_limit_meta.scheduled_for = soon;
    let due = serde_json::to_vec(&due).unwrap();
    let due_seal = seal_as(SIGNING_KEY, TASK_NAME, soon, soon + HOUR, &due);
    assert_eq!(t.send(&due, true, None, Some(due_seal.clone()), 0).await, StatusCode::OK);
    assert!(wall_clock_millis() >= soon, "answered only once its slot came");
    let published = t.pulled("overflow", 1).await;
    assert_eq!(published[0].attributes["drip-message-id"], "s2");
    let published_at = drip_core::time::parse_rfc3339(&published[0].publish_time).unwrap();
    assert!(published_at >= soon, "published at {published_at}, its slot {soon}");
    assert_eq!(t.send(&due, true, None, Some(due_seal), 1).await, StatusCode::OK, "a replay: a duplicate");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.pubsub.pull(&format!("{}-overflow", t.prefix), 10).await.is_empty(), "published once");
    // The once-only marker outlives the seal, so the captured body can never publish again.
    let identity = drip_core::event::MessageRef::new("s2", real.subscription.clone()).identity();
    let marker =
        drip_store::dispatch_key(&t.dispatcher.namespace, &format!("{}-payouts", t.prefix), "merchant_8421", &identity);
    let mut redis = drip_tests::redis_server::shared_connection().await;
    let ttl: i64 = redis::cmd("PTTL").arg(&marker).query_async(&mut redis).await.unwrap();
    assert!(ttl > (soon + HOUR) - wall_clock_millis(), "marker ttl {ttl} ms");
}

#[tokio::test]
async fn the_upgrade_window_publishes_unsealed_tasks_to_owned_topics_only_and_never_reseals_them() {
    let prefix = unique("dis");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "kyc-overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let until = drip_core::time::format_rfc3339(wall_clock_millis() + HOUR);
    let dispatcher = spawn_dispatcher_accepting_unsigned(
        &RULES.replace("{p}", &prefix),
        (&shared_url(), &unique("drip"), &pubsub.host),
        &until,
    )
    .await;
    let t = Test { prefix, pubsub, dispatcher, http: reqwest::Client::new() };
    let owned = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "u1", b"{}")).unwrap();
    assert_eq!(t.dispatch_unsigned(&owned).await, StatusCode::OK, "an unsigned task of the old version");
    let old = serde_json::to_vec(&task_body(&t.prefix, "payouts", "overflow", "u2", b"{}")).unwrap();
    assert_eq!(t.send(&old, true, None, Some(body_only_signature(&old)), 0).await, StatusCode::OK);
    let mut elsewhere = task_body(&t.prefix, "payouts", "overflow", "u3", b"{}");
    elsewhere.rate_limit_meta.overflow_topic = "projects/victim/topics/anything".into();
    assert_eq!(t.dispatch_unsigned(&serde_json::to_vec(&elsewhere).unwrap()).await, StatusCode::FORBIDDEN);
    let mut ids: Vec<String> =
        t.pulled("overflow", 2).await.iter().map(|m| m.attributes["drip-message-id"].clone()).collect();
    ids.sort();
    assert_eq!(ids, ["u1", "u2"]);
}
