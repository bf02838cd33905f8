//! A throttled key's backlog waits unbooked (docs/design.md: "Parking a throttled key's backlog"):
//! what the limiter and the dispatcher do with a parked answer, and the one wake task per key that
//! drains the queue at the rate in force when it runs.

use drip_core::budgets::{Budget, FairRing};
use drip_core::overflow::{FairWakeTask, WakeTask};
use drip_core::rules::Rule;
use drip_core::time::{Millis, format_rfc3339};
use drip_gcp::tasks::Created;
use drip_store::{Reserved, SlotRequest, Store};

use crate::metrics::ServiceMetrics;
use crate::tasks::Tasks;

/// How long a parked message's body is kept beyond its `max_delay` (the drain dead-letters it by then).
pub const BODY_MARGIN: Millis = drip_core::time::HOUR;

/// Parks the message of `request` (its answer is `Parked`): its body (the task body it would have
/// had) is kept for the drain, with its claim-checked payload if it has one, unless the call that
/// parked it kept it (`SlotRequest::parked_body`), and the key's drain is woken where its head's
/// slot comes within reach, unless a wake is armed already. The caller records the answer as acted
/// upon after.
pub async fn park(
    (store, tasks, metrics): (&dyn Store, &Tasks, &ServiceMetrics),
    (rule, request): (&Rule, &SlotRequest<'_>),
    reserved: &Reserved,
    body: &[u8],
) -> anyhow::Result<()> {
    if !reserved.body_kept(request) {
        let ttl = rule.max_delay + BODY_MARGIN;
        if let Some(reference) = drip_core::overflow::TaskBody::claim_check_of(body) {
            store.keep_payload(&reference, ttl).await?;
        }
        store.park_body(request, body, ttl).await?;
    }
    if let Some(budget) = rule.fair_budget() {
        return wake_ring((tasks, metrics), (rule, budget, request), reserved).await;
    }
    let horizon = rule.park().unwrap_or_default();
    let wanted = reserved.reservation.slot - horizon;
    // A redelivery (its answer resumed) arms again: the attempt that parked it may have died
    // before its wake existed. A wake armed twice for one time is one task.
    let wake = match store.arm_wake(rule, request.key, wanted).await? {
        Some(wake) => Some(wake),
        None if reserved.reservation.replayed() => Some(reserved.wake_at(wanted)),
        None => None,
    };
    if let Some(at) = wake {
        wake_at((tasks, metrics), (rule, request.key), at).await?;
    }
    tracing::info!(message = request.event.message_id, rule = %rule.name, key = request.key, wake = wake.map(format_rfc3339), "parked: the key is throttled");
    Ok(())
}

/// A key of a rule drawing from a fair budget parked, joined the budget's ring of waiting keys and
/// armed the ring's drain, unless a wake was armed already, in the same script call: the wake's
/// task, where the message's slot comes within the budget's near horizon (a redelivery makes it
/// again: the attempt that parked it may have died before its task existed; a wake made twice
/// for one time is one task).
async fn wake_ring(
    (tasks, metrics): (&Tasks, &ServiceMetrics),
    (rule, budget, request): (&Rule, &Budget, &SlotRequest<'_>),
    reserved: &Reserved,
) -> anyhow::Result<()> {
    let ring = FairRing::of_key(budget, request.scope());
    let wake = (reserved.armed || reserved.reservation.replayed())
        .then(|| reserved.ring_wake(budget.near().unwrap_or_default()));
    if let Some(at) = wake {
        fair_wake_at((tasks, metrics), ring, at).await?;
    }
    tracing::info!(message = request.event.message_id, rule = %rule.name, key = request.key, budget = %budget.name, wake = wake.map(format_rfc3339), "parked: waiting for its turn in a fair budget");
    Ok(())
}

/// Creates the task that wakes the drain of a fair budget's ring of waiting keys at `at`.
pub async fn fair_wake_at(
    (tasks, metrics): (&Tasks, &ServiceMetrics),
    ring: FairRing<'_>,
    at: Millis,
) -> anyhow::Result<Created> {
    let wake = FairWakeTask::of(ring);
    let name = wake.name(at);
    let partition = ring.partition.map(|p| p.to_string()).unwrap_or_default();
    let create = tasks.create((&ring.budget.name, &partition), &name, at, wake.body());
    Ok(metrics.time("cloud_tasks", create).await?)
}

/// Creates the task that wakes the drain of `key`'s parked messages at `at` (not batched: a wake
/// is no event).
pub async fn wake_at(
    (tasks, metrics): (&Tasks, &ServiceMetrics),
    (rule, key): (&Rule, &str),
    at: Millis,
) -> anyhow::Result<Created> {
    let wake = WakeTask { wake: drip_core::overflow::WakeOf { rule_id: rule.id.clone(), key: key.to_owned() } };
    let name = wake.name(at);
    let create = tasks.create((&rule.id, key), &name, at, wake.body());
    Ok(metrics.time("cloud_tasks", create).await?)
}
