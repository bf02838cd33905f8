//! The three things the limiter does with an event: forward it, schedule it, dead-letter it.
//! Each succeeds (the push may be acked), fails transiently (answer 5xx, Pub/Sub redelivers), or
//! fails for good (dead-letter it with the reason: no retry can help).

use std::collections::BTreeMap;

use drip_core::attributes::{Refused, Stamp};
use drip_core::delivery::Delivery;
use drip_core::event::Event;
use drip_core::outcome::DlqReason;
use drip_core::overflow::{CLAIM_CHECK_MARGIN, MAX_INLINE_TASK_BODY, RateLimitMeta, TaskBody, TaskPayload, task_id};
use drip_core::rules::{Forward, Rule};
use drip_core::time::{Millis, format_rfc3339};
use drip_gcp::http_target::{EventPost, PostError};
use drip_gcp::tasks::Created;
use drip_service::feedback;
use drip_service::task_batches::EventTask;
use drip_store::MessageOf;

use crate::AppState;

/// Why an action did not complete.
#[derive(Debug)]
pub enum Failure {
    /// Worth retrying: the push is answered 5xx and Pub/Sub redelivers.
    Transient(anyhow::Error),
    /// No retry can help: the event is dead-lettered with this reason.
    Permanent(Refused),
    /// The downstream asked to wait (`drip_core::delivery`): a 429 or 503 with `Retry-After` pauses
    /// the entity until then and the event gets a new slot after the pause; a 429 without one
    /// (`until` `None`) gets it a new slot at once, under the lowered adaptive level.
    /// `status` is the downstream's answer; `None` when the entity was found paused already.
    Wait { until: Option<Millis>, status: Option<u16>, detail: String },
}

impl Failure {
    /// A step that a retry may get through (a store, Pub/Sub or Cloud Tasks call that failed).
    pub fn transient(error: impl Into<anyhow::Error>) -> Self {
        Failure::Transient(error.into())
    }
}

pub fn permanent(reason: DlqReason, detail: impl Into<String>) -> Failure {
    Failure::Permanent(Refused { reason, detail: detail.into() })
}

/// The event being acted on, with what the reservation decided for it.
#[derive(Debug, Clone, Copy)]
pub struct Acting<'a> {
    pub rule: &'a Rule,
    pub key: &'a str,
    pub event: &'a Event,
    /// `MessageRef::identity` of the event.
    pub identity: &'a str,
    pub slot: Millis,
    pub cost: u64,
    /// When it was published (its answer's filing time), if known.
    pub published: Option<Millis>,
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
            published: self.published,
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

impl AppState {
    /// One step of a push: given at most the attempt deadline, and cut short once SIGTERM came
    /// and only a release and the answer still fit before SIGKILL.
    pub(crate) async fn step<T, E>(&self, step: impl Future<Output = Result<T, E>>) -> anyhow::Result<T>
    where
        anyhow::Error: From<E>,
    {
        Ok(self.shutdown.bound(self.attempt_deadline, step).await??)
    }

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
    /// Forwards the event; returns the cost the target reported it really had (`X-Drip-Cost`).
    pub(crate) async fn forward(&self, acting: Acting<'_>) -> Result<Option<u64>, Failure> {
        let Acting { rule, key, event, slot, .. } = acting;
        match &rule.forward {
            Forward::Topic(topic) => {
                let attributes =
                    acting.stamp().apply(&event.attributes, event.data.len()).map_err(Failure::Permanent)?;
                self.metrics
                    .time("pubsub", self.publishers.publish(topic, event.data.clone(), attributes))
                    .await
                    .map_err(Failure::transient)?;
                Ok(None)
            }
            Forward::Url(url) => {
                let post = EventPost {
                    message_id: &event.id,
                    subscription: event.subscription.as_deref(),
                    rule: &rule.name,
                    key,
                    scheduled_for: slot,
                    attributes: &event.attributes,
                    shadow: acting.shadow,
                    data: &event.data,
                };
                let started = std::time::Instant::now();
                let answer = self.metrics.time("forward_url", self.target.post(url, post)).await;
                self.latency.record((&*self.store, &self.metrics), (rule, key, None), started.elapsed()).await;
                let answer = match answer {
                    Ok(answer) => answer,
                    Err(PostError::InvalidHeader(detail)) => {
                        return Err(permanent(DlqReason::InvalidHeaderValue, detail));
                    }
                    Err(error) => return Err(Failure::Transient(error.into())),
                };
                let (status, detail) = (answer.status(), answer.detail("forward URL"));
                match answer.delivery() {
                    Delivery::Delivered { cost } => Ok(cost),
                    Delivery::Pause { until } => Err(Failure::Wait { until: Some(until), status, detail }),
                    Delivery::Reslot => Err(Failure::Wait { until: None, status, detail }),
                    Delivery::Retry => {
                        self.overloaded(rule, key, status).await;
                        Err(Failure::Transient(anyhow::anyhow!("{detail}")))
                    }
                    Delivery::DeadLetter(reason) => Err(permanent(reason, detail)),
                }
            }
        }
    }

    /// Lowers the adaptive level of the rule's feedback target after a 429, 408, 5xx or timeout
    /// (the event itself is retried by Pub/Sub): a failure to record it is only logged.
    async fn overloaded(&self, rule: &Rule, key: &str, status: Option<u16>) {
        let signal = feedback::Signal { status, until: None };
        if let Err(error) = feedback::apply((&*self.store, &self.metrics), rule, key, None, signal).await {
            tracing::warn!(rule = %rule.name, key, %error, "could not lower the adaptive limit");
        }
    }

    /// Creates the task that hands the event to the dispatcher at its slot (its own, or one it
    /// shares with the events of its queue and bucket that arrive with it).
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
                cost: Some(acting.cost),
            },
            payload: TaskPayload::inline(&event.data),
            attributes: event.attributes.clone(),
            message_id: event.id.clone(),
            subscription: event.subscription.clone(),
            publish_time: publish_time.map(str::to_owned),
        };
        // Serializing the task's own body cannot fail; were it to, a retry is the safe answer.
        let mut encoded = serde_json::to_vec(&body).map_err(Failure::transient)?;
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
            let reference = self.store.put_payload(of, &event.data, ttl).await.map_err(Failure::transient)?;
            body.payload = TaskPayload::ClaimCheck(reference);
            encoded = serde_json::to_vec(&body).map_err(Failure::transient)?;
        }
        let task = EventTask { name: task_id(&rule.id, identity, None), slot, body: encoded };
        let Some(tasks) = &self.tasks else {
            return Err(Failure::transient(anyhow::anyhow!("this instance creates no task: it serves no /push")));
        };
        let create = tasks.create((&rule.id, key), task);
        match self.metrics.time("cloud_tasks", create).await {
            Ok(created) => Ok(created),
            Err(error) if error.is_invalid() => Err(permanent(DlqReason::TaskRejected, error.to_string())),
            Err(error) => Err(Failure::transient(error)),
        }
    }
}
