//! The three things the limiter does with an event: forward it, schedule it, dead-letter it.
//! Each succeeds (the push may be acked), fails transiently (answer 5xx, Pub/Sub redelivers), or
//! fails for good (dead-letter it with the reason: no retry can help).

use std::collections::BTreeMap;

use drip_core::attributes::Stamp;
use drip_core::event::Event;
use drip_core::outcome::DlqReason;
use drip_core::overflow::{CLAIM_CHECK_MARGIN, MAX_INLINE_TASK_BODY, RateLimitMeta, TaskBody, TaskPayload, task_id};
use drip_core::rules::{Forward, Rule};
use drip_core::time::Millis;
use drip_gcp::http_target::EventPost;
use drip_gcp::tasks::Created;
use drip_service::reschedule;
use drip_service::task_batches::EventTask;
use drip_store::{MAX_BODY_KEPT_IN_CALL, MessageOf};

use crate::AppState;

pub use drip_service::reschedule::{Failure, Wait};

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
                let posted = self.metrics.time("forward_url", self.target.post(url, post)).await;
                self.latency.record((&*self.store, &self.metrics), (rule, key, None), started.elapsed()).await;
                reschedule::answered((&*self.store, &self.metrics), (rule, key), posted, "forward URL").await
            }
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
        let tasks = self.task_batcher().map_err(Failure::Transient)?;
        let task = self.task_for(acting, publish_time, now).await?;
        reschedule::create_task((tasks, &self.metrics), (&acting.rule.id, acting.key), task).await
    }

    /// The Cloud Tasks that carry delayed events, or why this instance has none.
    pub(crate) fn task_batcher(&self) -> anyhow::Result<&drip_service::task_batches::TaskBatcher> {
        self.tasks.as_deref().ok_or_else(|| anyhow::anyhow!("this instance creates no task: it serves no /push"))
    }

    /// The task that carries the event to the dispatcher at its slot: its body, with the payload
    /// inline or claim-checked in the store when too large for a task.
    pub(crate) async fn task_for(
        &self,
        acting: Acting<'_>,
        publish_time: Option<&str>,
        now: Millis,
    ) -> Result<EventTask, Failure> {
        let Acting { rule, key, event, identity, slot, .. } = acting;
        let (mut body, mut encoded) = task_body(acting, publish_time)?;
        if encoded.len() > MAX_INLINE_TASK_BODY {
            if event.data.len() > self.claim_check_max_bytes {
                let detail = format!(
                    "{} bytes: too large for a task and over DRIP_CLAIM_CHECK_MAX_BYTES ({})",
                    event.data.len(),
                    self.claim_check_max_bytes
                );
                return Err(Failure::permanent(DlqReason::PayloadTooLarge, detail));
            }
            let of = MessageOf { rule: &rule.id, key, message: identity };
            let ttl = slot - now + CLAIM_CHECK_MARGIN;
            let reference = self.store.put_payload(of, &event.data, ttl).await.map_err(Failure::transient)?;
            body.payload = TaskPayload::ClaimCheck(reference);
            encoded = serde_json::to_vec(&body).map_err(Failure::transient)?;
        }
        Ok(EventTask { name: task_id(&rule.id, identity, None), slot, body: encoded })
    }
}

/// The body a parked message would keep, built before its reservation so that the call that parks
/// it keeps it too (`SlotRequest::parked_body`; the call carries it when it is at most
/// `MAX_BODY_KEPT_IN_CALL`): for a rule drawing from a fair budget, whose events past its near
/// horizon park. An event whose data alone is larger builds its body after, should it park
/// (claim-checked when it must be). The drain gives it its slot.
pub(crate) fn parked_body(acting: Acting<'_>, publish_time: Option<&str>) -> Option<Vec<u8>> {
    let shadow = acting.rule.mode == drip_core::rules::Mode::Shadow;
    if acting.rule.fair_budget().is_none() || shadow || acting.event.data.len() > MAX_BODY_KEPT_IN_CALL {
        return None;
    }
    task_body(acting, publish_time).ok().map(|(_, encoded)| encoded)
}

/// The task body of the event `acting` at its slot, inline, and its encoding. The dispatcher adds
/// these attributes to the overflow message: what Pub/Sub would refuse then is refused now.
fn task_body(acting: Acting<'_>, publish_time: Option<&str>) -> Result<(TaskBody, Vec<u8>), Failure> {
    let Acting { rule, key, event, slot, .. } = acting;
    let overflow = Stamp { ratelimited: true, ..acting.stamp() };
    overflow.apply(&event.attributes, event.data.len()).map_err(Failure::Permanent)?;
    let first = rule.limits[0];
    let body = TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: key.to_owned(),
            rule: rule.name.clone(),
            rule_id: (rule.id != rule.name).then(|| rule.id.clone()),
            window_type: first.window_type(),
            limit: first.limit(),
            scheduled_for: slot,
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
    let encoded = serde_json::to_vec(&body).map_err(Failure::transient)?;
    Ok((body, encoded))
}
