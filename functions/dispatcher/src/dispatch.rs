//! `POST /dispatch`: one task in, one message out — on the rule's overflow topic, or on a
//! dead-letter topic with the reason. A task Drip made always ends up on a topic:
//!
//! - it is recognised by its seal (`x-drip-signature`, an HMAC with a key only the services hold
//!   over the task's name, slot, expiry and body), so a task whose overflow topic no rule names any
//!   more (rule edited, renamed or removed) is dead-lettered as `overflow_topic_retired`, never
//!   refused forever;
//! - an unsealed task is refused (403): a copied body under another name, a forged one, or one
//!   past its expiry is never published. Only while `DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL` lasts (an
//!   upgrade from a version that did not seal tasks) is an unsigned or body-only signed task
//!   published, and then only to a topic a configured rule owns, and never re-signed;
//! - a sealed task that arrives more than the early tolerance before its slot is answered 503, so
//!   Cloud Tasks tries it again later (a RunTask, or a replay); one inside it waits for its slot;
//! - a failure on the queue's last attempt (`X-CloudTasks-TaskRetryCount` + 1 = max attempts) is
//!   dead-lettered as `dispatch_failed` instead of letting Cloud Tasks delete the task.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use drip_core::attributes::{Refused, Stamp};
use drip_core::event::MessageRef;
use drip_core::outcome::{DlqReason, Outcome};
use drip_core::overflow::{FairWakeTask, SIGNATURE_HEADER, Signature, TaskBatch, TaskBody, TaskPayload, WakeTask};
use drip_core::rules::{OverflowFormat, Rule, ServiceRules};
use drip_core::schedule::{OldSlot, Status};
use drip_core::time::{Millis, format_rfc3339, wall_clock_millis};
use drip_gcp::http_target::EventPost;
use drip_service::answer::Answer;
use drip_service::reschedule::{self, Failure, Rescheduler, Wait};
use drip_store::{DispatchClaim, MessageOf, Reserved, SlotRequest};

use crate::AppState;
use crate::task::{Delivery, dead_letter, filing_of, new_task, request_of, stamp_of};

/// Cloud Tasks sets these on every dispatch; a request without them did not come from a queue.
const TASK_HEADERS: [&str; 2] = ["x-cloudtasks-queuename", "x-cloudtasks-taskname"];

/// Where a task's message goes.
enum Route<'r> {
    Overflow(&'r Rule),
    /// Drip's task, but no rule owns its overflow topic now: the DLQ of its rule (if it still
    /// exists by name) or the file's fallback.
    Retired(Option<&'r Rule>),
}

impl<'r> Route<'r> {
    /// The configured rule whose dead-letter topic takes this task's failures, if any.
    fn rule(&self) -> Option<&'r Rule> {
        match *self {
            Route::Overflow(rule) => Some(rule),
            Route::Retired(rule) => rule,
        }
    }
}

pub async fn dispatch(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Answer {
    let Admitted { delivery, signed } = match admit(&state, &headers, &body).await {
        Ok(admitted) => admitted,
        Err(Rejected { outcome, status }) => return Answer::new(status, None, outcome),
    };
    if let Some(wake) = WakeTask::parse(&body) {
        if delivery.sealed_until.is_none() {
            tracing::error!(task = delivery.task, "dispatch refused: an unsealed wake task");
            return Answer::new(StatusCode::FORBIDDEN, None, Outcome::NotATask);
        }
        return crate::drain::wake(&state, &wake, &delivery).await;
    }
    if let Some(wake) = FairWakeTask::parse(&body) {
        if delivery.sealed_until.is_none() {
            tracing::error!(task = delivery.task, "dispatch refused: an unsealed wake task");
            return Answer::new(StatusCode::FORBIDDEN, None, Outcome::NotATask);
        }
        return crate::drain::fair_wake(&state, &wake, &delivery).await;
    }
    match TaskBatch::parse(&body) {
        // Batches came after seals: an unsealed one is no task of ours.
        Some(_) if delivery.sealed_until.is_none() => {
            tracing::error!(task = delivery.task, "dispatch refused: an unsealed batch task");
            Answer::new(StatusCode::FORBIDDEN, None, Outcome::NotATask)
        }
        Some(batch) => dispatch_batch(&state, &batch, &delivery).await,
        None => dispatch_one(&state, &delivery, signed).await,
    }
}

/// Why a request is not dispatched, and the answer that says so.
struct Rejected {
    outcome: Outcome,
    status: StatusCode,
}

/// A request Cloud Tasks made for a task of ours that is due, and whether we signed it (a seal, or
/// an earlier version's body-only signature).
struct Admitted<'a> {
    delivery: Delivery<'a>,
    signed: bool,
}

/// Checks that the request is Cloud Tasks' for a task the limiter sealed, unexpired and due
/// (waiting out a lead within the early tolerance), or refuses it.
async fn admit<'a>(state: &AppState, headers: &'a HeaderMap, body: &'a [u8]) -> Result<Admitted<'a>, Rejected> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let refuse = |outcome: Outcome, status: StatusCode| Err(Rejected { outcome, status });
    if let Some(missing) = TASK_HEADERS.iter().find(|h| !headers.contains_key(**h)) {
        tracing::warn!(header = missing, "dispatch refused: not a Cloud Tasks request");
        return refuse(Outcome::NotATask, StatusCode::FORBIDDEN);
    }
    let task = header("x-cloudtasks-taskname").unwrap_or_default();
    let now = wall_clock_millis();
    let (signed, sealed_until) = match state.signer.verify(header(SIGNATURE_HEADER), task, body) {
        Signature::Sealed { expires, .. } if now > expires => {
            tracing::error!(task, expired = %format_rfc3339(expires), "dispatch refused: the task's seal has expired (a replay, or a queue that outlived its retry span)");
            return refuse(Outcome::TaskExpired, StatusCode::FORBIDDEN);
        }
        Signature::Sealed { slot, .. } if slot - now > state.early_tolerance => {
            tracing::warn!(task, slot = %format_rfc3339(slot), early_ms = slot - now, "task ran before its slot; Cloud Tasks will try it again");
            return refuse(Outcome::Early, StatusCode::SERVICE_UNAVAILABLE);
        }
        Signature::Sealed { slot, expires } => {
            if slot > now {
                tokio::time::sleep(std::time::Duration::from_millis((slot - now) as u64)).await;
            }
            (true, Some(expires))
        }
        Signature::Forged => {
            tracing::error!(task, "dispatch refused: the task's signature is not ours for this task");
            return refuse(Outcome::NotATask, StatusCode::FORBIDDEN);
        }
        legacy if state.accepts_unsigned(now) => (legacy == Signature::BodyOnly, None),
        _ => {
            tracing::error!(
                task,
                "dispatch refused: an unsealed task (DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL is not in force)"
            );
            return refuse(Outcome::NotATask, StatusCode::FORBIDDEN);
        }
    };
    let retry_count = header("x-cloudtasks-taskretrycount").and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Admitted { delivery: Delivery { task, retry_count, body, sealed_until }, signed })
}

/// Each event of a batch at its own slot, all at once: 200 once every one is on a topic (or its
/// DLQ); a retry publishes only those whose claim is not done yet.
async fn dispatch_batch(state: &AppState, batch: &TaskBatch<'_>, delivery: &Delivery<'_>) -> Answer {
    let events = batch.batch.iter().map(|event| async move {
        let delivery = Delivery { body: event.get().as_bytes(), ..*delivery };
        let task: TaskBody = match serde_json::from_slice(delivery.body) {
            Ok(task) => task,
            Err(error) => return dead_letter_malformed(state, &delivery, &error.to_string()).await,
        };
        let wait = task.rate_limit_meta.scheduled_for - wall_clock_millis();
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
        }
        dispatch_task(state, &task, &delivery, true).await
    });
    let answers = futures_util::future::join_all(events).await;
    tracing::info!(task = delivery.task, events = answers.len(), "batch task dispatched");
    Answer::all(answers, StatusCode::OK)
}

/// One event's task body: its message onto its topic, once.
async fn dispatch_one(state: &AppState, delivery: &Delivery<'_>, signed: bool) -> Answer {
    match serde_json::from_slice::<TaskBody>(delivery.body) {
        Ok(task) => dispatch_task(state, &task, delivery, signed).await,
        Err(error) => dead_letter_malformed(state, delivery, &error.to_string()).await,
    }
}

async fn dispatch_task(state: &AppState, task: &TaskBody, delivery: &Delivery<'_>, signed: bool) -> Answer {
    let meta = &task.rate_limit_meta;
    let rules = state.rules.current();
    let route = match owner_of(&rules, meta.rule_id(), &meta.overflow_topic) {
        Some(rule) => Route::Overflow(rule),
        // Ours, and its rule (by id) now overflows elsewhere: the rule's overflow topic now.
        None if signed => rules.rule_by_id(meta.rule_id()).map_or(Route::Retired(None), Route::Overflow),
        None => {
            tracing::error!(task = delivery.task, topic = %meta.overflow_topic, rule = %meta.rule, "dispatch refused: an unsigned task names a topic no rule owns");
            return Answer::new(StatusCode::FORBIDDEN, Some(&meta.rule), Outcome::UnknownOverflowTopic);
        }
    };
    let rule_label = match route {
        Route::Overflow(rule) => rule.name.clone(),
        Route::Retired(_) => meta.rule.clone(),
    };
    let outcome = match deliver(state, task, &route, delivery).await {
        Ok(outcome) => Ok(outcome),
        Err(error) if state.is_last_attempt(delivery.retry_count) => {
            let detail = format!("attempt {} of {}: {error:#}", delivery.retry_count + 1, state.max_attempts);
            let refused = Refused { reason: DlqReason::DispatchFailed, detail };
            dead_letter(state, (Some(task), route.rule()), refused, None, delivery)
                .await
                .map_err(|dlq| error.context(format!("and dead-lettering it failed too: {dlq:#}")))
        }
        Err(error) => Err(error),
    };
    match outcome {
        Ok(Outcome::Busy) => Answer::new(StatusCode::SERVICE_UNAVAILABLE, Some(&rule_label), Outcome::Busy),
        Ok(outcome) => {
            let now = wall_clock_millis();
            let lateness = now - meta.scheduled_for;
            if outcome == Outcome::Published {
                state.metrics.observe(&rule_label, lateness.max(0) as f64 / 1_000.0);
            }
            let (task_name, retry_count) = (delivery.task, delivery.retry_count);
            if matches!(outcome, Outcome::DeadLetter(_)) {
                tracing::error!(task = task_name, retry_count, message_id = %task.message_id, rule = %rule_label, key = %meta.key, %outcome, "task dead-lettered");
            } else {
                tracing::info!(task = task_name, retry_count, message_id = %task.message_id, rule = %rule_label, key = %meta.key, %outcome, lateness_ms = lateness, "dispatched");
            }
            Answer::new(StatusCode::OK, Some(&rule_label), outcome)
        }
        Err(error) => {
            tracing::warn!(
                task = delivery.task,
                retry_count = delivery.retry_count,
                error = format!("{error:#}"),
                "dispatch failed; Cloud Tasks will retry"
            );
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, Some(&rule_label), Outcome::Retry)
        }
    }
}

/// The rule the task names (by id), if it owns the topic; else any rule that owns it.
fn owner_of<'a>(rules: &'a ServiceRules, rule_id: &str, topic: &str) -> Option<&'a Rule> {
    let owners = || rules.rules.iter().filter(|r| r.overflow_topic == topic);
    owners().find(|r| r.id == rule_id).or_else(|| owners().next())
}

/// Publishes the task's message once: a claim in Redis keeps a concurrent or repeated run of the
/// task (Cloud Tasks runs one twice, rarely) from publishing it again.
async fn deliver(
    state: &AppState,
    task: &TaskBody,
    route: &Route<'_>,
    delivery: &Delivery<'_>,
) -> anyhow::Result<Outcome> {
    let meta = &task.rate_limit_meta;
    let identity = MessageRef::new(task.message_id.clone(), task.subscription.clone()).identity_with(&task.attributes);
    let of = MessageOf { rule: meta.rule_id(), key: &meta.key, message: &identity };
    match state.store.claim_dispatch(of, state.lease).await? {
        DispatchClaim::Done => return Ok(Outcome::Duplicate),
        DispatchClaim::Busy => return Ok(Outcome::Busy),
        DispatchClaim::Acquired => {}
    }
    let result = publish(state, task, route, delivery).await;
    match &result {
        // The event's new task publishes it: it must be able to claim it.
        Ok(Outcome::Rescheduled) => {
            if let Err(error) = state.store.release_dispatch(of).await {
                tracing::warn!(%error, "could not release the dispatch claim; it expires by itself");
            }
        }
        Ok(_) => {
            let memory = delivery.marker_memory(wall_clock_millis());
            if let Err(error) = state.store.finish_dispatch(of, memory).await {
                tracing::warn!(%error, "could not record the dispatch; a second run would publish again");
            }
        }
        Err(_) => {
            if let Err(error) = state.store.release_dispatch(of).await {
                tracing::warn!(%error, "could not release the dispatch claim; it expires by itself");
            }
        }
    }
    result
}

async fn publish(
    state: &AppState,
    task: &TaskBody,
    route: &Route<'_>,
    delivery: &Delivery<'_>,
) -> anyhow::Result<Outcome> {
    let data = match &task.payload {
        TaskPayload::Json(_) | TaskPayload::Bytes(_) => task.payload.data().unwrap_or_default(),
        TaskPayload::ClaimCheck(reference) => match state.store.get_payload(reference).await? {
            Some(data) => data,
            None => {
                // Retrying cannot bring it back: the dead letter carries the task body, which names the event.
                let detail = format!("the claim-checked payload {reference} is gone");
                let refused = Refused { reason: DlqReason::ClaimCheckMissing, detail };
                return dead_letter(state, (Some(task), route.rule()), refused, None, delivery).await;
            }
        },
    };
    let delivered = match route {
        Route::Overflow(rule) => match deliver_event(state, task, (rule, delivery), &data).await {
            Err(Failure::Wait(wait)) => reschedule(state, task, (rule, delivery), &wait).await,
            delivered => delivered,
        },
        Route::Retired(_) => {
            let meta = &task.rate_limit_meta;
            let detail = format!("no rule has overflow topic {} now (rule {})", meta.overflow_topic, meta.rule);
            Err(Failure::permanent(DlqReason::OverflowTopicRetired, detail))
        }
    };
    match delivered {
        Ok(outcome) => Ok(outcome),
        Err(Failure::Permanent(refused)) => {
            dead_letter(state, (Some(task), route.rule()), refused, Some(data), delivery).await
        }
        Err(Failure::Transient(error)) => Err(error),
        Err(Failure::Wait(wait)) => Err(anyhow::anyhow!("{}: told to wait again", wait.detail)),
    }
}

/// The event onto the rule's overflow topic or URL, unless it must wait: a pause that began after
/// its task was made (its slot was reserved before it) holds it too, and a task that comes after
/// its slot's windows takes its turn.
async fn deliver_event(
    state: &AppState,
    task: &TaskBody,
    (rule, delivery): (&Rule, &Delivery<'_>),
    data: &[u8],
) -> Result<Outcome, Failure> {
    // The enriched body, when the rule wants it; a dead letter carries the data as it came.
    let enriched = match rule.overflow_format {
        OverflowFormat::Original => None,
        OverflowFormat::Enriched => {
            let enriched = TaskBody { payload: TaskPayload::inline(data), ..task.clone() };
            Some(serde_json::to_vec(&enriched).map_err(Failure::transient)?)
        }
    };
    let stamp = Stamp { ratelimited: true, ..stamp_of(task, Some(rule)) };
    let attributes =
        stamp.apply(&task.attributes, enriched.as_ref().map_or(data.len(), Vec::len)).map_err(Failure::Permanent)?;
    if state.tasks.is_some() {
        let paused = state.store.paused_until(rule, &task.rate_limit_meta.key).await.map_err(Failure::transient)?;
        if let Some(until) = paused.filter(|&until| until > wall_clock_millis()) {
            let why = format!("paused until {} (the downstream said to wait)", format_rfc3339(until));
            return Err(Failure::Wait(Wait::paused(why)));
        }
        let slot = task.rate_limit_meta.scheduled_for;
        if rule.waits_when_late(slot, wall_clock_millis())
            && let Some(later) = take_turn(state, task, (rule, delivery), slot).await?
        {
            return Ok(later);
        }
    }
    if let Some(url) = &rule.overflow_url {
        return deliver_to_url(state, task, rule, url, data).await;
    }
    let message = enriched.unwrap_or_else(|| data.to_vec());
    let publish = state.publishers.publish(&rule.overflow_topic, message, attributes);
    state.metrics.time("pubsub", publish).await.map_err(Failure::transient)?;
    Ok(Outcome::Published)
}

/// POSTs the event to the rule's `overflow: { url }`: delivered (a cost it reports corrects what
/// the event booked), or what its answer means (`reschedule::answered`).
async fn deliver_to_url(
    state: &AppState,
    task: &TaskBody,
    rule: &Rule,
    url: &str,
    data: &[u8],
) -> Result<Outcome, Failure> {
    let meta = &task.rate_limit_meta;
    let post = EventPost {
        message_id: &task.message_id,
        subscription: task.subscription.as_deref(),
        rule: &rule.name,
        key: &meta.key,
        scheduled_for: meta.scheduled_for,
        attributes: &task.attributes,
        shadow: None,
        data,
    };
    let started = std::time::Instant::now();
    let posted = state.metrics.time("overflow_url", state.target.post(url, post)).await;
    state.latency.record((&*state.store, &state.metrics), (rule, &meta.key, None), started.elapsed()).await;
    let store = (&*state.store, &*state.metrics);
    if let Some(actual) = reschedule::answered(store, (rule, &meta.key), posted, "the overflow URL").await? {
        // What the call really cost corrects what the event booked (once per message); the
        // event was delivered, so failing to record it is only logged.
        let (identity, published) = filing_of(task);
        let request = request_of(rule, task, &identity, published);
        if let Err(error) =
            drip_service::costs::correct(&*state.store, &state.metrics, &rule.name, &request, actual).await
        {
            tracing::warn!(rule = %rule.name, key = %meta.key, %error, "could not correct the event's cost");
        }
    }
    Ok(Outcome::Published)
}

/// The event must wait (`reschedule::Rescheduler::after_wait`): a new slot and a new task at it.
async fn reschedule(
    state: &AppState,
    task: &TaskBody,
    (rule, delivery): (&Rule, &Delivery<'_>),
    wait: &Wait,
) -> Result<Outcome, Failure> {
    let rescheduler = rescheduler(state, delivery, &wait.detail)?;
    let (identity, published) = filing_of(task);
    let request = request_of(rule, task, &identity, published);
    let new_task = async |reserved: &Reserved| new_task(state, task, (rule, &identity), reserved).await;
    let (moved, done) = rescheduler.after_wait((rule, &request), wait, new_task).await;
    // A new slot with its task, or none to be had (the caller dead-letters the event): either way
    // a duplicate push of the message has nothing left to do.
    if let Some(moved) = moved.filter(|_| !matches!(done, Err(Failure::Transient(_)))) {
        completed(state, &request, &moved).await;
    }
    done.map(|()| Outcome::Rescheduled)
}

/// A task that comes after its slot's windows (created or retried late, a publish refused for a
/// while) would land on the events that own the window it comes in: it takes the earliest slot
/// that fits now, its old one given back. `None`: that slot is now, deliver it; else a new task
/// carries it there.
async fn take_turn(
    state: &AppState,
    task: &TaskBody,
    (rule, delivery): (&Rule, &Delivery<'_>),
    slot: Millis,
) -> Result<Option<Outcome>, Failure> {
    let why = format!("late for its slot {}", format_rfc3339(slot));
    let rescheduler = rescheduler(state, delivery, &why)?;
    let (identity, published) = filing_of(task);
    let request = SlotRequest { reslot: Some(OldSlot::GivenBack), ..request_of(rule, task, &identity, published) };
    let reserved = rescheduler.new_slot(&request).await?;
    if let Some(refused) = reschedule::beyond_reach(&reserved, &why) {
        completed(state, &request, &reserved).await;
        return Err(Failure::Permanent(refused));
    }
    // Parked (its key's earlier messages wait in its queue: FIFO), it waits for its turn there
    // too, whatever the slot its window would have had now.
    let later = reserved.reservation.slot > reserved.now || reserved.reservation.status == Status::Parked;
    if later {
        let new_task = async |reserved: &Reserved| new_task(state, task, (rule, &identity), reserved).await;
        rescheduler.task_at((rule, &request), &reserved, new_task).await?;
    } else {
        tracing::info!(message_id = %task.message_id, rule = %rule.name, key = %task.rate_limit_meta.key, "{why}: its new slot is now");
    }
    completed(state, &request, &reserved).await;
    Ok(later.then_some(Outcome::Rescheduled))
}

/// What gives this task's events new slots, or why this instance cannot.
fn rescheduler<'a>(state: &'a AppState, delivery: &Delivery<'_>, why: &str) -> Result<Rescheduler<'a>, Failure> {
    let Some(tasks) = &state.tasks else {
        return Err(Failure::transient(anyhow::anyhow!(
            "{why}; DRIP_TASKS_QUEUES and DRIP_DISPATCHER_URL are not set, so Cloud Tasks retries it instead"
        )));
    };
    if delivery.sealed_until.is_none() {
        return Err(Failure::transient(anyhow::anyhow!(
            "{why}; the task came unsealed, and Drip never signs what it did not seal: Cloud Tasks retries it"
        )));
    }
    Ok(Rescheduler { store: &*state.store, metrics: &state.metrics, tasks })
}

/// Records the event's answer as acted upon (its new slot's task exists, it goes now, or it is
/// dead-lettered): a redelivered push of it is then acked as it is. A failure is only logged.
async fn completed(state: &AppState, request: &SlotRequest<'_>, reserved: &Reserved) {
    if let Err(error) = state.store.complete(request, reserved).await {
        tracing::warn!(%error, "could not record the new slot as acted upon");
    }
}

/// A body that is not a task of ours can never succeed: dead-letter it and stop the retries.
async fn dead_letter_malformed(state: &AppState, delivery: &Delivery<'_>, error: &str) -> Answer {
    let refused = Refused { reason: DlqReason::MalformedTask, detail: error.to_owned() };
    match dead_letter(state, (None, None), refused, None, delivery).await {
        Ok(outcome) => {
            tracing::error!(task = delivery.task, error, "malformed task body dead-lettered");
            Answer::new(StatusCode::OK, None, outcome)
        }
        Err(error) => {
            tracing::warn!(task = delivery.task, %error, "could not dead-letter a malformed task");
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, None, Outcome::Retry)
        }
    }
}
