//! "The downstream said wait": one step for the limiter and the dispatcher. An event whose target
//! answered 429 or 503 (with or without `Retry-After`), or that found its key or budget paused, or
//! that came too late for its slot, takes a new slot — its old one's units kept or given back,
//! atomically — and a task at it, created with the other delayed events of its queue and bucket.
//! A slot that cannot be had (beyond `max_delay`, or a cost over a count in force) is a
//! [`Failure::Permanent`], which each service publishes through its one dead-letter path.

use drip_core::attributes::Refused;
use drip_core::delivery::Delivery;
use drip_core::outcome::DlqReason;
use drip_core::rules::Rule;
use drip_core::schedule::{OldSlot, Status};
use drip_core::time::format_rfc3339;
use drip_gcp::http_target::{PostError, Posted};
use drip_gcp::tasks::Created;
use drip_store::{Reserved, SlotRequest, Store};

use crate::feedback::{self, Signal};
use crate::metrics::ServiceMetrics;
use crate::task_batches::{EventTask, TaskBatcher};

/// Why a step of acting on an event did not complete.
#[derive(Debug)]
pub enum Failure {
    /// Worth retrying: the request is answered 5xx and Pub/Sub or Cloud Tasks tries it again.
    Transient(anyhow::Error),
    /// No retry can help: the event is dead-lettered with this reason.
    Permanent(Refused),
    /// The event must wait: it gets a new slot and a task at it ([`Rescheduler::after_wait`]).
    Wait(Wait),
}

impl Failure {
    /// A step that a retry may get through (a store, Pub/Sub or Cloud Tasks call that failed).
    pub fn transient(error: impl Into<anyhow::Error>) -> Self {
        Failure::Transient(error.into())
    }

    pub fn permanent(reason: DlqReason, detail: impl Into<String>) -> Self {
        Failure::Permanent(Refused { reason, detail: detail.into() })
    }
}

/// Why an event waits.
#[derive(Debug, Clone)]
pub struct Wait {
    /// The downstream's answer that refused the event: a 429 or 503 with `Retry-After` pauses the
    /// rule's feedback target until then, one without it lowers the adaptive level. `None`: the
    /// event found its key or budget paused and was never delivered.
    pub signal: Option<Signal>,
    pub detail: String,
}

impl Wait {
    /// A pause found before delivery.
    pub fn paused(detail: impl Into<String>) -> Self {
        Self { signal: None, detail: detail.into() }
    }

    /// What becomes of the old slot's units: an event never delivered gives them back; a refused
    /// one keeps them only if the rule counts refused calls.
    fn old_slot(&self, rule: &Rule) -> OldSlot {
        match self.signal {
            Some(_) => rule.refused_slot(),
            None => OldSlot::GivenBack,
        }
    }
}

/// What a target's answer to an event's POST means for it: delivered (with the cost it reported,
/// if any), or why not. A 408, 5xx or timeout lowers the adaptive level of the rule's feedback
/// target and is retried; `target` names the URL's role in the details.
pub async fn answered(
    (store, metrics): (&dyn Store, &ServiceMetrics),
    (rule, key): (&Rule, &str),
    posted: Result<Posted, PostError>,
    target: &str,
) -> Result<Option<u64>, Failure> {
    let answer = match posted {
        Ok(Posted { answer, partner }) => {
            if rule.learn.is_some() && !(partner.is_empty() && partner.ignored.is_empty()) {
                let delivered = matches!(answer.delivery(), Delivery::Delivered { .. });
                let now = drip_core::time::wall_clock_millis();
                crate::learn::act((store, metrics), (rule, key), &partner, delivered, now).await;
            }
            answer
        }
        Err(PostError::InvalidHeader(detail)) => return Err(Failure::permanent(DlqReason::InvalidHeaderValue, detail)),
        Err(error) => return Err(Failure::transient(error)),
    };
    let (status, detail) = (answer.status(), answer.detail(target));
    match answer.delivery() {
        Delivery::Delivered { cost } => Ok(cost),
        Delivery::Pause { until } => {
            Err(Failure::Wait(Wait { signal: Some(Signal { status, until: Some(until) }), detail }))
        }
        Delivery::Reslot => Err(Failure::Wait(Wait { signal: Some(Signal { status, until: None }), detail })),
        Delivery::Retry => {
            // The event itself is retried: a failure to lower the level is only logged.
            let signal = Signal { status, until: None };
            if let Err(error) = feedback::apply((store, metrics), rule, key, None, signal).await {
                tracing::warn!(rule = %rule.name, key, %error, "could not lower the adaptive limit");
            }
            Err(Failure::Transient(anyhow::anyhow!("{detail}")))
        }
        Delivery::DeadLetter(reason) => Err(Failure::permanent(reason, detail)),
    }
}

/// Creates the task that carries an event to the dispatcher at its slot (batched with the events
/// of its queue and bucket that wait with it). Cloud Tasks refusing the task itself is permanent.
pub async fn create_task(
    (tasks, metrics): (&TaskBatcher, &ServiceMetrics),
    (rule, key): (&str, &str),
    task: EventTask,
) -> Result<Created, Failure> {
    match metrics.time("cloud_tasks", tasks.create((rule, key), task)).await {
        Ok(created) => Ok(created),
        Err(error) if error.is_invalid() => Err(Failure::permanent(DlqReason::TaskRejected, error.to_string())),
        Err(error) => Err(Failure::transient(error)),
    }
}

/// Gives events new slots and tasks at them. The caller records the event's answer as acted upon
/// (`Store::complete`) once the task exists, as after any other action.
#[derive(Clone, Copy)]
pub struct Rescheduler<'a> {
    pub store: &'a dyn Store,
    pub metrics: &'a ServiceMetrics,
    pub tasks: &'a TaskBatcher,
}

impl std::fmt::Debug for Rescheduler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rescheduler").field("tasks", self.tasks).finish_non_exhaustive()
    }
}

impl Rescheduler<'_> {
    /// The event must wait: the downstream's signal applied (a pause, a lower adaptive level),
    /// then a new slot (after any pause) and a task at it, built by `task` for the new reservation.
    /// Returns the reservation the event's answer now holds, once it got one (the caller records
    /// that one as acted upon), and how the step ended: a slot that cannot be had is permanent.
    pub async fn after_wait(
        &self,
        (rule, request): (&Rule, &SlotRequest<'_>),
        wait: &Wait,
        task: impl AsyncFnOnce(&Reserved) -> Result<EventTask, Failure>,
    ) -> (Option<Reserved>, Result<(), Failure>) {
        if let Some(signal) = wait.signal {
            let effect = match feedback::apply((self.store, self.metrics), rule, request.key, None, signal).await {
                Ok(effect) => effect,
                Err(error) => return (None, Err(Failure::transient(error))),
            };
            tracing::warn!(message = request.event.message_id, rule = %rule.name, key = request.key, target = %effect.target, status = signal.status, until = signal.until.map(format_rfc3339), detail = %wait.detail, "the downstream asked to wait: event rescheduled");
        }
        let request = SlotRequest { reslot: Some(wait.old_slot(rule)), ..*request };
        let reserved = match self.new_slot(&request).await {
            Ok(reserved) => reserved,
            Err(failure) => return (None, Err(failure)),
        };
        if let Some(refused) = beyond_reach(&reserved, &wait.detail) {
            return (Some(reserved), Err(Failure::Permanent(refused)));
        }
        (Some(reserved), self.task_at((rule, &request), &reserved, task).await.map(drop))
    }

    /// The event's new slot (`request.reslot` says what becomes of its old one): see
    /// [`beyond_reach`] for whether it got one.
    pub async fn new_slot(&self, request: &SlotRequest<'_>) -> Result<Reserved, Failure> {
        debug_assert!(request.reslot.is_some(), "a new slot replaces an answer");
        self.store.reserve(request).await.map_err(Failure::transient)
    }

    /// A task that carries the event to the slot `reserved` holds; or, when it parked (its key is
    /// throttled), its body kept for the key's drain (`parking::park`).
    pub async fn task_at(
        &self,
        (rule, request): (&Rule, &SlotRequest<'_>),
        reserved: &Reserved,
        task: impl AsyncFnOnce(&Reserved) -> Result<EventTask, Failure>,
    ) -> Result<Created, Failure> {
        let task = task(reserved).await?;
        if reserved.reservation.status == Status::Parked {
            let tools = (self.store, self.tasks.tasks(), self.metrics);
            crate::parking::park(tools, (rule, request), reserved, &task.body).await.map_err(Failure::transient)?;
            return Ok(Created::New);
        }
        let slot = task.slot;
        let created = create_task((self.tasks, self.metrics), (request.rule, request.key), task).await?;
        tracing::info!(message = request.event.message_id, rule = request.rule, key = request.key, slot = %format_rfc3339(slot), "rescheduled");
        Ok(created)
    }
}

/// Why a new reservation holds no slot (beyond `max_delay`, or a cost over a count in force),
/// as the dead letter says it (`why` first); `None` when it holds one.
pub fn beyond_reach(reserved: &Reserved, why: &str) -> Option<Refused> {
    let reason = match reserved.reservation.status {
        // Parked: the key's drain gives it its slot (a request that parks only comes from a caller
        // that parks what is parked).
        Status::Reserved | Status::Parked => return None,
        Status::MaxDelayExceeded => DlqReason::MaxDelayExceeded,
        Status::CostExceedsLimit => DlqReason::CostExceedsLimit,
    };
    let slot = format_rfc3339(reserved.reservation.slot);
    Some(Refused { reason, detail: format!("{why}; the next slot, {slot}, cannot be had ({reason})") })
}
