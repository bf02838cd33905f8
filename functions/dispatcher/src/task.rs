//! What a dispatch and a drain both do with a task: how Cloud Tasks presented it, the request its
//! event was reserved under, its new task at a new slot, and its dead letter.

use drip_core::attributes::{Refused, Stamp};
use drip_core::event::MessageRef;
use drip_core::outcome::Outcome;
use drip_core::overflow::{CLAIM_CHECK_MARGIN, RateLimitMeta, TaskBody, TaskPayload, task_id};
use drip_core::rules::Rule;
use drip_core::time::{DAY, HOUR, Millis};
use drip_service::reschedule::Failure;
use drip_service::task_batches::EventTask;
use drip_store::{Reserved, SlotRequest};

use crate::AppState;

/// The task as Cloud Tasks presented it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivery<'a> {
    pub(crate) task: &'a str,
    /// 0 on the first attempt.
    pub(crate) retry_count: i64,
    pub(crate) body: &'a [u8],
    /// Its seal's expiry, when it came sealed; `None` for a legacy (unsealed) task.
    pub(crate) sealed_until: Option<Millis>,
}

impl Delivery<'_> {
    /// How long the once-only marker must outlive now: past the seal's expiry, so that a captured
    /// body can never be published a second time.
    pub(crate) fn marker_memory(&self, now: Millis) -> Millis {
        self.sealed_until.map_or(DAY, |expires| (expires - now + HOUR).max(DAY))
    }
}

/// The task's event's request, as its reservation named it.
pub(crate) fn request_of<'a>(
    rule: &'a Rule,
    task: &'a TaskBody,
    identity: &'a str,
    published: Option<Millis>,
) -> SlotRequest<'a> {
    let meta = &task.rate_limit_meta;
    SlotRequest::for_rule(rule, &meta.key, identity, meta.cost.unwrap_or(1)).published(published)
}

/// The event's new task at the slot `reserved` holds (a claim-checked payload kept until then).
pub(crate) async fn new_task(
    state: &AppState,
    task: &TaskBody,
    (rule, identity): (&Rule, &str),
    reserved: &Reserved,
) -> Result<EventTask, Failure> {
    let slot = reserved.reservation.slot;
    if let TaskPayload::ClaimCheck(reference) = &task.payload {
        let keep = slot - reserved.now + CLAIM_CHECK_MARGIN;
        state.store.keep_payload(reference, keep).await.map_err(Failure::transient)?;
    }
    let rate_limit_meta = RateLimitMeta { scheduled_for: slot, ..task.rate_limit_meta.clone() };
    let body = serde_json::to_vec(&TaskBody { rate_limit_meta, ..task.clone() }).map_err(Failure::transient)?;
    Ok(EventTask { name: task_id(&rule.id, identity, Some(slot)), slot, body })
}

/// Where the task's message's answer is filed: its identity and its publish time.
pub(crate) fn filing_of(task: &TaskBody) -> (String, Option<Millis>) {
    let identity = MessageRef::new(task.message_id.clone(), task.subscription.clone()).identity_with(&task.attributes);
    (identity, drip_core::event::filing_time(task.publish_time.as_deref(), &task.attributes))
}

pub(crate) fn stamp_of<'a>(task: &'a TaskBody, rule: Option<&'a Rule>) -> Stamp<'a> {
    let meta = &task.rate_limit_meta;
    Stamp {
        message_id: Some(&task.message_id),
        subscription: task.subscription.as_deref(),
        rule: Some(rule.map_or(meta.rule.as_str(), |r| r.name.as_str())),
        key: Some(&meta.key),
        scheduled_for: Some(meta.scheduled_for),
        published: drip_core::event::filing_time(task.publish_time.as_deref(), &task.attributes),
        ..Stamp::default()
    }
}

/// The dispatcher's one way to dead-letter: the event's data (`data`; else the payload the task
/// carries inline; else the task's body as it came), stamped with the reason, the task's name and
/// what the task names.
pub(crate) async fn dead_letter(
    state: &AppState,
    (task, rule): (Option<&TaskBody>, Option<&Rule>),
    refused: Refused,
    data: Option<Vec<u8>>,
    delivery: &Delivery<'_>,
) -> anyhow::Result<Outcome> {
    let rules = state.rules.current();
    let topic = rules.dlq_topic_for(rule);
    let data = data.or_else(|| task.and_then(|t| t.payload.data())).unwrap_or_else(|| delivery.body.to_vec());
    let named = task.map_or_else(Stamp::default, |task| stamp_of(task, rule));
    let stamp = Stamp { reason: Some((refused.reason, &refused.detail)), task: Some(delivery.task), ..named };
    let no_attributes = Default::default();
    let (data, attributes) = stamp.dead_letter(task.map_or(&no_attributes, |t| &t.attributes), &data);
    state.metrics.time("pubsub", state.publishers.publish(topic, data, attributes)).await?;
    Ok(Outcome::DeadLetter(refused.reason))
}
