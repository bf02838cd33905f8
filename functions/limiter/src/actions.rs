//! The three things the limiter does with an event: forward it, schedule it, dead-letter it.
//! Each either succeeds (the push may be acked) or fails transiently (answer 5xx, redeliver).

use std::collections::{BTreeMap, HashMap};

use drip_core::overflow::{RateLimitMeta, TaskBody};
use drip_core::rules::{Forward, Rule};
use drip_core::time::{DAY, Millis, format_rfc3339};
use drip_gcp::tasks::Created;
use google_cloud_auth::credentials::idtoken::IDTokenCredentials;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use crate::AppState;
use drip_core::event::Event;

/// A failure worth retrying: the push is answered 5xx and Pub/Sub redelivers.
#[derive(Debug)]
pub struct Transient(pub anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for Transient {
    fn from(error: E) -> Self {
        Transient(error.into())
    }
}

/// Cloud Tasks accepts tasks up to 100 KB; keep room for the headers and the task's own fields.
const MAX_INLINE_TASK_BODY: usize = 90 * 1024;
/// How long a claim-checked payload outlives its slot, for dispatch retries.
const CLAIM_CHECK_MARGIN: Millis = DAY;
/// Pub/Sub attribute values are at most 1024 bytes.
const MAX_ATTRIBUTE_BYTES: usize = 1024;

pub struct DeadLetter<'a> {
    pub rule: Option<&'a Rule>,
    pub key: Option<&'a str>,
    pub reason: &'a str,
    pub detail: &'a str,
    pub scheduled_for: Option<Millis>,
    pub message_id: Option<&'a str>,
    pub attributes: &'a BTreeMap<String, String>,
    pub data: &'a [u8],
}

pub enum Forwarded {
    Done,
    /// The forward URL refused the event for good (a 4xx other than 429).
    Rejected(String),
}

pub enum Scheduled {
    Created,
    AlreadyExisted,
    /// Too large for a task and for the claim-check store.
    TooLarge(usize),
}

fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The task's name within its queue, derived from (rule, message id) so a retried create for a
/// redelivered message is refused as ALREADY_EXISTS instead of scheduling the event twice.
pub fn task_id(rule: &str, message_id: &str) -> String {
    let digest = Sha256::digest(format!("{rule}\0{message_id}").as_bytes());
    format!("{}-{rule}", hex(&digest[..16]))
}

/// A key's tasks always go to the same queue.
pub fn queue_index(rule: &str, key: &str, queues: usize) -> usize {
    let digest = Sha256::digest(format!("{rule}|{key}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % queues.max(1) as u64) as usize
}

impl AppState {
    pub(crate) async fn dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), Transient> {
        let topic = self
            .rules
            .dlq_topic_for(letter.rule)
            .ok_or_else(|| Transient(anyhow::anyhow!("no dead-letter topic configured")))?
            .to_owned();
        let mut attributes = letter.attributes.clone();
        attributes.insert("drip-reason".into(), letter.reason.to_owned());
        attributes.insert("drip-detail".into(), truncate(letter.detail, MAX_ATTRIBUTE_BYTES));
        let known = [
            ("drip-rule", letter.rule.map(|r| r.name.clone())),
            ("drip-key", letter.key.map(|k| truncate(k, MAX_ATTRIBUTE_BYTES))),
            ("drip-scheduled-for", letter.scheduled_for.map(format_rfc3339)),
            ("drip-message-id", letter.message_id.map(|id| truncate(id, MAX_ATTRIBUTE_BYTES))),
        ];
        for (name, value) in known {
            if let Some(value) = value {
                attributes.insert(name.into(), value);
            }
        }
        self.metrics.time("pubsub", self.publishers.publish(&topic, letter.data.to_vec(), attributes)).await?;
        Ok(())
    }

    /// Forwards the event at its `slot` (now, or after an inline wait).
    pub(crate) async fn forward(
        &self,
        rule: &Rule,
        key: &str,
        event: &Event,
        slot: Millis,
    ) -> Result<Forwarded, Transient> {
        match &rule.forward {
            Forward::Topic(topic) => {
                let mut attributes = event.attributes.clone();
                attributes.insert("drip-message-id".into(), truncate(&event.id, MAX_ATTRIBUTE_BYTES));
                attributes.insert("drip-scheduled-for".into(), format_rfc3339(slot));
                attributes.insert("drip-rule".into(), rule.name.clone());
                attributes.insert("drip-key".into(), truncate(key, MAX_ATTRIBUTE_BYTES));
                self.metrics
                    .shared
                    .time("pubsub", self.publishers.publish(topic, event.data.clone(), attributes))
                    .await?;
                Ok(Forwarded::Done)
            }
            Forward::Url(url) => {
                let content_type = if serde_json::from_slice::<serde::de::IgnoredAny>(&event.data).is_ok() {
                    "application/json"
                } else {
                    "application/octet-stream"
                };
                let mut request = self
                    .http
                    .post(url)
                    .header("content-type", content_type)
                    .header("x-drip-message-id", &event.id)
                    .header("x-drip-rule", &rule.name)
                    .header("x-drip-key", key)
                    .header("x-drip-scheduled-for", format_rfc3339(slot))
                    .header("x-drip-attributes", serde_json::to_string(&event.attributes)?)
                    .body(event.data.clone());
                if let Some(token) = self.id_tokens.token_for(url).await? {
                    request = request.bearer_auth(token);
                }
                let response = self.metrics.time("forward_url", request.send()).await?;
                let status = response.status();
                if status.is_success() {
                    Ok(Forwarded::Done)
                } else if status.as_u16() == 429 || status.is_server_error() {
                    Err(Transient(anyhow::anyhow!("forward URL answered {status}")))
                } else {
                    Ok(Forwarded::Rejected(format!("forward URL answered {status}")))
                }
            }
        }
    }

    /// Creates the task that hands the event to the dispatcher at `slot`.
    pub(crate) async fn schedule(
        &self,
        rule: &Rule,
        key: &str,
        event: &Event,
        publish_time: Option<&str>,
        slot: Millis,
        now: Millis,
    ) -> Result<Scheduled, Transient> {
        let first = rule.limits[0];
        let mut body = TaskBody {
            is_ratelimited: true,
            rate_limit_meta: RateLimitMeta {
                key: key.to_owned(),
                rule: rule.name.clone(),
                window_type: first.window_type(),
                limit: first.limit,
                scheduled_for: format_rfc3339(slot),
                overflow_topic: rule.overflow_topic.clone(),
            },
            original_payload: None,
            original_payload_base64: None,
            claim_check: None,
            attributes: event.attributes.clone(),
            message_id: event.id.clone(),
            publish_time: publish_time.map(str::to_owned),
        };
        let mut encoded = serde_json::to_vec(&body.clone().with_data(&event.data))?;
        if encoded.len() > MAX_INLINE_TASK_BODY {
            if event.data.len() > self.claim_check_max_bytes {
                return Ok(Scheduled::TooLarge(event.data.len()));
            }
            let reference = drip_store::claim_check::claim_check_key(&self.namespace, &rule.name, key, &event.id);
            let mut redis = self.redis.clone();
            let ttl = slot - now + CLAIM_CHECK_MARGIN;
            self.metrics
                .shared
                .time("redis", drip_store::claim_check::put(&mut redis, &reference, &event.data, ttl))
                .await?;
            body.claim_check = Some(reference);
            encoded = serde_json::to_vec(&body)?;
        }
        let queue = &self.queues[queue_index(&rule.name, key, self.queues.len())];
        let headers = HashMap::from([("Content-Type".to_owned(), "application/json".to_owned())]);
        let created = self
            .metrics
            .shared
            .time("cloud_tasks", self.tasks.create(queue, &task_id(&rule.name, &event.id), slot, encoded, headers))
            .await?;
        Ok(match created {
            Created::New => Scheduled::Created,
            Created::AlreadyExisted => Scheduled::AlreadyExisted,
        })
    }
}

/// Google ID tokens for forward URLs on Cloud Run, one credential per audience.
#[derive(Debug)]
pub struct ForwardIdToken {
    mode: String,
    credentials: Mutex<HashMap<String, IDTokenCredentials>>,
}

impl ForwardIdToken {
    /// `auto` (for `*.run.app`), `always` or `never`.
    pub fn new(mode: &str) -> Self {
        Self { mode: mode.to_owned(), credentials: Mutex::default() }
    }

    async fn token_for(&self, url: &str) -> anyhow::Result<Option<String>> {
        let audience = url.split('/').take(3).collect::<Vec<_>>().join("/");
        let wanted = match self.mode.as_str() {
            "always" => true,
            "never" => false,
            _ => audience.ends_with(".run.app"),
        };
        if !wanted {
            return Ok(None);
        }
        let mut credentials = self.credentials.lock().await;
        if !credentials.contains_key(&audience) {
            let built = google_cloud_auth::credentials::idtoken::Builder::new(audience.clone()).build()?;
            credentials.insert(audience.clone(), built);
        }
        let token = credentials[&audience].id_token().await?;
        Ok(Some(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_are_stable_valid_and_distinct() {
        let id = task_id("payouts", "1234");
        assert_eq!(id, task_id("payouts", "1234"));
        assert_ne!(id, task_id("payouts", "1235"));
        assert_ne!(id, task_id("kyc", "1234"));
        assert!(id.len() <= 500 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[test]
    fn a_key_always_maps_to_one_queue_and_keys_spread() {
        assert_eq!(queue_index("r", "k", 4), queue_index("r", "k", 4));
        let used: std::collections::HashSet<usize> = (0..64).map(|i| queue_index("r", &format!("k{i}"), 4)).collect();
        assert_eq!(used.len(), 4);
    }
}
