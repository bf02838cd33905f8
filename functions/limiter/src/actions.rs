//! The three things the limiter does with an event: forward it, schedule it, dead-letter it.
//! Each succeeds (the push may be acked), fails transiently (answer 5xx, Pub/Sub redelivers), or
//! fails for good (dead-letter it with the reason: no retry can help).

use std::collections::{BTreeMap, HashMap};

use axum::http::HeaderValue;
use drip_core::attributes::{Refused, Stamp};
use drip_core::event::Event;
use drip_core::outcome::DlqReason;
use drip_core::overflow::{RateLimitMeta, SIGNATURE_HEADER, TaskBody, TaskPayload};
use drip_core::rules::{Forward, Rule};
use drip_core::time::{DAY, Millis, format_rfc3339};
use drip_gcp::tasks::Created;
use drip_store::MessageOf;
use google_cloud_auth::credentials::idtoken::IDTokenCredentials;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use crate::AppState;
use crate::settings::ForwardIdTokenMode;

/// Why an action did not complete.
#[derive(Debug)]
pub enum Failure {
    /// Worth retrying: the push is answered 5xx and Pub/Sub redelivers.
    Transient(anyhow::Error),
    /// No retry can help: the event is dead-lettered with this reason.
    Permanent(Refused),
    /// The downstream asked to wait (429 or 503 with `Retry-After`) until then: the entity pauses and
    /// the event gets a new slot after the pause.
    Wait { until: Millis, status: u16, detail: String },
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure::Transient(error.into())
    }
}

pub fn permanent(reason: DlqReason, detail: impl Into<String>) -> Failure {
    Failure::Permanent(Refused { reason, detail: detail.into() })
}

/// Cloud Tasks takes tasks up to 1 MB; keep room for the task's URL, headers and own fields.
pub const MAX_INLINE_TASK_BODY: usize = 1_000_000 - 32 * 1024;
/// How long a claim-checked payload outlives its slot, for dispatch retries.
const CLAIM_CHECK_MARGIN: Millis = DAY;

/// The event being acted on, with what the reservation decided for it.
#[derive(Debug, Clone, Copy)]
pub struct Acting<'a> {
    pub rule: &'a Rule,
    pub key: &'a str,
    pub event: &'a Event,
    /// `MessageRef::identity` of the event.
    pub identity: &'a str,
    pub slot: Millis,
    /// A `mode: shadow` rule's would-be decision: forwarded at once, saying it.
    pub shadow: Option<&'a str>,
}

impl Acting<'_> {
    fn stamp(&self) -> Stamp<'_> {
        Stamp {
            message_id: Some(&self.event.id),
            subscription: self.event.subscription.as_deref(),
            rule: Some(&self.rule.name),
            key: Some(self.key),
            scheduled_for: Some(self.slot),
            shadow_decision: self.shadow,
            ..Stamp::default()
        }
    }
}

/// What is known of an event that is dead-lettered.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    pub rule: Option<&'a Rule>,
    pub key: Option<&'a str>,
    pub reason: DlqReason,
    pub detail: &'a str,
    pub scheduled_for: Option<Millis>,
    pub message_id: Option<&'a str>,
    pub subscription: Option<&'a str>,
    pub attributes: &'a BTreeMap<String, String>,
    pub data: &'a [u8],
}

/// The task's name within its queue, derived from (rule, message identity) so a retried create for
/// a redelivered message is refused as ALREADY_EXISTS instead of scheduling the event twice, while
/// one id from two subscriptions makes two tasks.
pub fn task_id(rule: &str, identity: &str) -> String {
    let digest = Sha256::digest(format!("{rule}\0{identity}").as_bytes());
    format!("{}-{rule}", hex::encode(&digest[..16]))
}

/// A key's tasks always go to the same queue.
pub fn queue_index(rule: &str, key: &str, queues: usize) -> usize {
    let digest = Sha256::digest(format!("{rule}|{key}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % queues.max(1) as u64) as usize
}

/// When a `Retry-After` (delta-seconds or an HTTP date) ends, capped at a day.
pub fn retry_after_until(value: &str) -> Option<Millis> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Some(wait_seconds(seconds));
    }
    let now = drip_core::time::wall_clock_millis();
    let until = drip_core::time::system_time_to_millis(httpdate::parse_http_date(value.trim()).ok()?)?;
    Some(until.clamp(now, now + DAY))
}

/// When a wait of `seconds` from now ends, capped at a day.
pub fn wait_seconds(seconds: u64) -> Millis {
    drip_core::time::wall_clock_millis() + (seconds.min(DAY as u64 / 1_000) * 1_000) as Millis
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, Failure> {
    HeaderValue::from_str(value).map_err(|_| {
        let shown: String = value.chars().take(64).collect();
        permanent(DlqReason::InvalidHeaderValue, format!("{name} cannot be an HTTP header value: {shown:?}"))
    })
}

impl AppState {
    pub(crate) async fn dead_letter(&self, letter: DeadLetter<'_>) -> anyhow::Result<()> {
        let rules = self.rules.current();
        let topic = rules.dlq_topic_for(letter.rule);
        let stamp = Stamp {
            message_id: letter.message_id,
            subscription: letter.subscription,
            rule: letter.rule.map(|r| r.name.as_str()),
            key: letter.key,
            scheduled_for: letter.scheduled_for,
            reason: Some((letter.reason, letter.detail)),
            ..Stamp::default()
        };
        let (data, attributes) = stamp.dead_letter(letter.attributes, letter.data);
        self.metrics.time("pubsub", self.publishers.publish(topic, data, attributes)).await?;
        Ok(())
    }

    /// Forwards the event at its slot (now, or after an inline wait).
    pub(crate) async fn forward(&self, acting: Acting<'_>) -> Result<(), Failure> {
        let Acting { rule, key, event, slot, .. } = acting;
        match &rule.forward {
            Forward::Topic(topic) => {
                let attributes =
                    acting.stamp().apply(&event.attributes, event.data.len()).map_err(Failure::Permanent)?;
                self.metrics.time("pubsub", self.publishers.publish(topic, event.data.clone(), attributes)).await?;
                Ok(())
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
                    .header("x-drip-message-id", header_value("the message id", &event.id)?)
                    .header("x-drip-rule", header_value("the rule", &rule.name)?)
                    .header("x-drip-key", header_value("the key", key)?)
                    .header("x-drip-scheduled-for", format_rfc3339(slot))
                    .header(
                        "x-drip-attributes",
                        header_value("the attributes", &serde_json::to_string(&event.attributes)?)?,
                    )
                    .body(event.data.clone());
                if let Some(would) = acting.shadow {
                    request = request.header("x-drip-shadow-decision", would);
                }
                if let Some(subscription) = &event.subscription {
                    request = request.header("x-drip-subscription", header_value("the subscription", subscription)?);
                }
                if let Some(token) = self.id_tokens.token_for(url).await? {
                    request = request.bearer_auth(token);
                }
                let response = match self.metrics.time("forward_url", request.send()).await {
                    Ok(response) => response,
                    Err(error) => {
                        self.overloaded(rule, key, None).await;
                        return Err(Failure::Transient(error.into()));
                    }
                };
                let status = response.status();
                let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok());
                if status.is_success() {
                    Ok(())
                } else if let (429 | 503, Some(until)) = (status.as_u16(), retry_after.and_then(retry_after_until)) {
                    Err(Failure::Wait {
                        until,
                        status: status.as_u16(),
                        detail: format!(
                            "forward URL answered {status}, Retry-After {}",
                            retry_after.unwrap_or_default()
                        ),
                    })
                } else if status.as_u16() == 429 || status.as_u16() == 408 || status.is_server_error() {
                    self.overloaded(rule, key, Some(status.as_u16())).await;
                    Err(Failure::Transient(anyhow::anyhow!("forward URL answered {status}")))
                } else if status.is_redirection() {
                    // Following it would turn the POST into a bodiless GET: the event would be lost.
                    let location = response.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or("-");
                    Err(permanent(
                        DlqReason::ForwardRejected,
                        format!("forward URL answered {status}; Location: {location}"),
                    ))
                } else {
                    Err(permanent(DlqReason::ForwardRejected, format!("forward URL answered {status}")))
                }
            }
        }
    }

    /// Lowers the adaptive level of the rule's feedback target after a 429, 408, 5xx or timeout
    /// (the event itself is retried by Pub/Sub): a failure to record it is only logged.
    async fn overloaded(&self, rule: &Rule, key: &str, status: Option<u16>) {
        let signal = crate::feedback::Signal { status, until: None };
        if let Err(error) = crate::feedback::apply(self, rule, key, None, signal).await {
            tracing::warn!(rule = %rule.name, key, %error, "could not lower the adaptive limit");
        }
    }

    /// Creates the task that hands the event to the dispatcher at its slot.
    pub(crate) async fn schedule(
        &self,
        acting: Acting<'_>,
        publish_time: Option<&str>,
        now: Millis,
    ) -> Result<Created, Failure> {
        let Acting { rule, key, event, identity, slot, .. } = acting;
        // The dispatcher adds these to the overflow message: refuse now what Pub/Sub would refuse then.
        let overflow = Stamp { ratelimited: true, ..acting.stamp() };
        overflow.apply(&event.attributes, event.data.len()).map_err(Failure::Permanent)?;
        let first = rule.limits[0];
        let mut body = TaskBody {
            is_ratelimited: true,
            rate_limit_meta: RateLimitMeta {
                key: key.to_owned(),
                rule: rule.name.clone(),
                rule_id: (rule.id != rule.name).then(|| rule.id.clone()),
                window_type: first.window_type(),
                limit: first.limit(),
                scheduled_for: format_rfc3339(slot),
                overflow_topic: rule.overflow_topic.to_string(),
            },
            payload: TaskPayload::inline(&event.data),
            attributes: event.attributes.clone(),
            message_id: event.id.clone(),
            subscription: event.subscription.clone(),
            publish_time: publish_time.map(str::to_owned),
        };
        let mut encoded = serde_json::to_vec(&body)?;
        if encoded.len() > MAX_INLINE_TASK_BODY {
            if event.data.len() > self.claim_check_max_bytes {
                let detail = format!(
                    "{} bytes: too large for a task and over DRIP_CLAIM_CHECK_MAX_BYTES ({})",
                    event.data.len(),
                    self.claim_check_max_bytes
                );
                return Err(permanent(DlqReason::PayloadTooLarge, detail));
            }
            let of = MessageOf { rule: &rule.id, key, message: identity };
            let ttl = slot - now + CLAIM_CHECK_MARGIN;
            let reference = self.metrics.time("redis", self.store.put_payload(of, &event.data, ttl)).await?;
            body.payload = TaskPayload::ClaimCheck(reference);
            encoded = serde_json::to_vec(&body)?;
        }
        let queue = &self.queues[queue_index(&rule.id, key, self.queues.len())];
        let headers = HashMap::from([
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (SIGNATURE_HEADER.to_owned(), self.signer.sign(&encoded)),
        ]);
        let name = task_id(&rule.id, identity);
        let create = self.tasks.create(queue, &name, slot, encoded, headers);
        match self.metrics.time("cloud_tasks", create).await {
            Ok(created) => Ok(created),
            Err(error) if error.is_invalid() => Err(permanent(DlqReason::TaskRejected, error.to_string())),
            Err(error) => Err(error.into()),
        }
    }
}

/// Google ID tokens for forward URLs on Cloud Run, one credential per audience.
#[derive(Debug)]
pub struct ForwardIdToken {
    mode: ForwardIdTokenMode,
    credentials: Mutex<HashMap<String, IDTokenCredentials>>,
}

impl ForwardIdToken {
    pub fn new(mode: ForwardIdTokenMode) -> Self {
        Self { mode, credentials: Mutex::default() }
    }

    async fn token_for(&self, url: &str) -> anyhow::Result<Option<String>> {
        let audience = url.split('/').take(3).collect::<Vec<_>>().join("/");
        let wanted = match self.mode {
            ForwardIdTokenMode::Always => true,
            ForwardIdTokenMode::Never => false,
            ForwardIdTokenMode::Auto => audience.ends_with(".run.app"),
        };
        if !wanted {
            return Ok(None);
        }
        // Built once per audience under the lock; fetching the token happens after it is released.
        let credentials = {
            let mut credentials = self.credentials.lock().await;
            if !credentials.contains_key(&audience) {
                let built = google_cloud_auth::credentials::idtoken::Builder::new(audience.clone()).build()?;
                credentials.insert(audience.clone(), built);
            }
            credentials[&audience].clone()
        };
        Ok(Some(credentials.id_token().await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_are_stable_valid_and_distinct() {
        let id = task_id("payouts", "1234@aaaaaaaaaaaa");
        assert_eq!(id, task_id("payouts", "1234@aaaaaaaaaaaa"));
        assert_ne!(id, task_id("payouts", "1234@bbbbbbbbbbbb"));
        assert_ne!(id, task_id("payouts", "1235@aaaaaaaaaaaa"));
        assert_ne!(id, task_id("kyc", "1234@aaaaaaaaaaaa"));
        assert!(id.len() <= 500 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[test]
    fn a_key_always_maps_to_one_queue_and_keys_spread() {
        assert_eq!(queue_index("r", "k", 4), queue_index("r", "k", 4));
        let used: std::collections::HashSet<usize> = (0..64).map(|i| queue_index("r", &format!("k{i}"), 4)).collect();
        assert_eq!(used.len(), 4);
    }

    #[test]
    fn header_values_with_control_characters_are_refused_for_good() {
        assert!(header_value("k", "merchant_1").is_ok());
        match header_value("the key", "merchant\n1") {
            Err(Failure::Permanent(refused)) => assert_eq!(refused.reason, DlqReason::InvalidHeaderValue),
            other => panic!("{other:?}"),
        }
    }
}
