//! `POST /push`: one Pub/Sub message in, one action out, acked (204) only once the action is done.
//!
//! Only one attempt at a message acts at a time, across instances: the reservation takes a lease
//! on the message's answer in the same script call; a concurrent duplicate finds it held and is
//! answered 503 (Pub/Sub retries later, by when the first attempt has completed or released it).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use drip_core::event::Event;
use drip_core::outcome::{DlqReason, Outcome};
use drip_core::routing::{Decision, Plan, plan};
use drip_core::rules::{Mode, Rule};
use drip_core::schedule::{Attempt, OldSlot, Reservation, ReserveRequest};
use drip_core::time::{Millis, format_rfc3339, wall_clock_millis};
use drip_service::answer::Answer;
use drip_service::reschedule::Rescheduler;
use drip_service::task_batches::TaskBatcher;
use drip_store::{Reserved, SlotRequest};

use crate::AppState;
use crate::actions::{Acting, DeadLetter, Failure, Wait};
use crate::envelope::{self, PushedMessage};

/// 204 once the event is forwarded, scheduled or dead-lettered; 503 when any of that failed
/// transiently or another attempt is acting on it. Never 202: the Pub/Sub emulator takes it for a nack.
pub async fn push(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Answer {
    // Counted from its start: a task create lingers for the pushes still on their way to one.
    let _caller = state.tasks.as_deref().and_then(TaskBatcher::caller);
    // Whatever hangs, the push answers before SIGKILL (each step below is cut earlier still).
    state
        .shutdown
        .before_kill(respond(&state, &headers, &body))
        .await
        .unwrap_or_else(|cut| answer(None, Err(cut.into())))
}

/// The answer to a push whose event (of `rule`, when one matched) ended in `result`.
fn answer(rule: Option<&Rule>, result: anyhow::Result<Outcome>) -> Answer {
    let rule = rule.map(|r| r.name.as_str());
    match result {
        Ok(Outcome::Busy) => Answer::new(StatusCode::SERVICE_UNAVAILABLE, rule, Outcome::Busy),
        Ok(outcome) => Answer::new(StatusCode::NO_CONTENT, rule, outcome),
        Err(error) => {
            tracing::warn!(error = format!("{error:#}"), "push failed; Pub/Sub will redeliver");
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, rule, Outcome::Retry)
        }
    }
}

async fn respond(state: &AppState, headers: &HeaderMap, body: &Bytes) -> Answer {
    let unusable = match envelope::parse(headers, body) {
        Ok(message) => return handle(state, message).await,
        Err(unusable) => unusable,
    };
    tracing::warn!(reason = %unusable.reason, detail = %unusable.detail, "unusable push request");
    let letter = DeadLetter {
        rule: None,
        key: None,
        reason: unusable.reason,
        detail: &unusable.detail,
        scheduled_for: None,
        message_id: unusable.message_id.as_deref(),
        subscription: None,
        attributes: &unusable.attributes,
        data: &unusable.data,
    };
    let result = state.step(state.dead_letter(letter)).await;
    answer(None, result.map(|()| Outcome::DeadLetter(unusable.reason)))
}

async fn handle(state: &AppState, message: PushedMessage) -> Answer {
    let PushedMessage { id, subscription, publish_time, attributes, data } = message;
    let event = Event::new(id, attributes, data).with_subscription(subscription);
    let rules = state.rules.current();
    match plan(&rules, &event) {
        Plan::Reserve { rule, key, cost, previous_key } => {
            let reserving = Reserving { rule, key: &key, cost, previous_key: previous_key.as_deref() };
            answer(Some(rule), reserve_and_act(state, &event, reserving, publish_time.as_deref()).await)
        }
        Plan::DeadLetter { rule, key, reason, detail } => {
            log_decision(&event, rule, key.as_deref(), Outcome::DeadLetter(reason), None, false);
            let result =
                state.step(state.dead_letter(letter(&event, rule, key.as_deref(), reason, &detail, None))).await;
            answer(rule, result.map(|()| Outcome::DeadLetter(reason)))
        }
    }
}

/// What the routing decided for an event to reserve.
struct Reserving<'a> {
    rule: &'a Rule,
    key: &'a str,
    cost: u64,
    previous_key: Option<&'a str>,
}

/// Reserves the event's slot and acts on it once: the outcome, or why it must be retried.
async fn reserve_and_act(
    state: &AppState,
    event: &Event,
    Reserving { rule, key, cost, previous_key }: Reserving<'_>,
    publish_time: Option<&str>,
) -> anyhow::Result<Outcome> {
    let identity = event.message_ref().identity_with(&event.attributes);
    // The publish time is the same on every redelivery (and replay): the answer is filed under it.
    let published = drip_core::event::filing_time(publish_time, &event.attributes);
    // A rule whose key template changed: the subject's frontier under its previous key carries over.
    let floor = match previous_key {
        Some(previous) => state.step(state.store.frontier(rule, previous)).await?,
        None => None,
    };
    // The body it keeps should it park, built first so that the call that parks it keeps it too
    // (its slot is the drain's to give).
    let parking =
        Acting { rule, key, event, identity: &identity, slot: wall_clock_millis(), cost, published, shadow: None };
    let parked_body = crate::actions::parked_body(parking, publish_time);
    let mut request = SlotRequest::for_rule(rule, key, &identity, cost);
    request.event = ReserveRequest { lease: state.lease, published, floor, ..request.event };
    if let Some(body) = &parked_body {
        request = request.keeping_if_parked(body);
    }
    let mut reserved = state.step(state.store.reserve(&request)).await?;
    // A redelivery of an event that was to go at once, after its attempt died (its lease held the
    // slot meanwhile), would land on the events that own the window it comes in: it takes the
    // earliest slot that fits now, its old one given back (it was never forwarded).
    if reserved.reservation.attempt == Attempt::Resumed
        && Decision::of(&reserved.reservation, rule.inline_wait) == Decision::Forward
        && rule.waits_when_late(reserved.reservation.slot, reserved.now)
    {
        let again = SlotRequest { reslot: Some(OldSlot::GivenBack), ..request };
        tracing::info!(message_id = %event.id, rule = %rule.name, key, slot = %format_rfc3339(reserved.reservation.slot), "a redelivery late for its slot: given a new one");
        reserved = state.step(state.store.reserve(&again)).await?;
    }
    let reservation = reserved.reservation;
    match reservation.attempt {
        Attempt::Busy => {
            tracing::info!(message_id = %event.id, rule = %rule.name, key, "another attempt is acting on this message: 503");
            return Ok(Outcome::Busy);
        }
        Attempt::Done => {
            tracing::info!(message_id = %event.id, rule = %rule.name, key, "redelivery of a message already acted upon: acked");
            return Ok(Outcome::Redelivered);
        }
        Attempt::Decided | Attempt::Resumed => {}
    }
    let slot = reservation.slot;
    let acting = Acting { rule, key, event, identity: &identity, slot, cost, published, shadow: None };
    // A body built before the call that the call did not carry (over what a call carries) is
    // the one to keep after, should the event park: not built twice.
    let unsent = parked_body.as_deref().filter(|_| request.parked_body.is_none());
    let act = act(state, acting, (&request, unsent), &reserved, publish_time);
    let result = state.step(act).await;
    // After a downstream's Retry-After, the message's answer is its new slot.
    let (outcome, reserved) = match result {
        Ok(done) => done,
        Err(error) => {
            if let Err(release) = state.store.release(&request, &reserved).await {
                tracing::warn!(message_id = %event.id, %release, "could not release the message's lease; it expires by itself");
            }
            return Err(error);
        }
    };
    let reservation = reserved.reservation;
    log_decision(event, Some(rule), Some(key), outcome, Some(&reservation), reservation.replayed());
    if !reservation.replayed() && !matches!(outcome, Outcome::DeadLetter(DlqReason::MaxDelayExceeded)) {
        let delay = (reservation.slot - reservation.decided_at) as f64 / 1_000.0;
        state.metrics.observe(&rule.name, delay);
        if rule.classes.is_some()
            && let Some((_, class)) = drip_core::rules::Classes::split(key)
        {
            state.metrics.observe_class(&rule.name, class, delay);
        }
    }
    // Acting twice on a redelivery is what this prevents; failing to record it only risks that
    // (the lease still holds a concurrent duplicate off until it expires).
    if let Err(error) = state.store.complete(&request, &reserved).await {
        tracing::warn!(message_id = %event.id, %error, "could not record the message as acted upon");
    }
    Ok(outcome)
}

/// Carries out the reservation's decision; a permanent failure becomes a dead letter, a downstream's
/// "wait" (429 or 503 with Retry-After) a pause of the entity and a task at the message's new slot.
/// Returns the outcome and the reservation it ended on.
async fn act(
    state: &AppState,
    acting: Acting<'_>,
    (request, unsent): (&SlotRequest<'_>, Option<&[u8]>),
    reserved: &Reserved,
    publish_time: Option<&str>,
) -> anyhow::Result<(Outcome, Reserved)> {
    let Acting { rule, key, event, slot, .. } = acting;
    let (reservation, now) = (&reserved.reservation, reserved.now);
    let decision = Decision::of(reservation, rule.inline_wait);
    let would = decision.shadow_text();
    let done = match decision {
        // Reserved and recorded as if enforced; the event goes now, saying what would have happened
        // (a forward refused for good is dead-lettered, as when enforcing).
        _ if rule.mode == Mode::Shadow => {
            let forwarded = state.forward(Acting { shadow: Some(&would), ..acting }).await;
            reported_cost(state, rule, request, &forwarded).await;
            forwarded.map(|_| match decision {
                Decision::Forward => Outcome::Forward,
                Decision::Delay | Decision::Park => Outcome::Delay,
                Decision::DeadLetter(reason) => Outcome::DeadLetter(reason),
            })
        }
        Decision::DeadLetter(reason) => {
            let detail = match reason {
                DlqReason::CostExceedsLimit => {
                    "the cost is more than a limit in force for this key (an override)".into()
                }
                _ => format!("the earliest slot {} is beyond max_delay", format_rfc3339(slot)),
            };
            Err(Failure::Permanent(drip_core::attributes::Refused { reason, detail }))
        }
        Decision::Forward => {
            let wait = (slot - now).clamp(0, rule.inline_wait);
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            // A pause that began while the event waited holds it too (the reservation saw none).
            let paused = match wait {
                0 => None,
                _ => state.store.paused_until(rule, key).await?,
            };
            match paused.filter(|&until| until > wall_clock_millis()) {
                Some(until) => Err(Failure::Wait(Wait::paused(format!(
                    "paused until {} while it waited inline",
                    format_rfc3339(until)
                )))),
                None => {
                    let forwarded = state.forward(acting).await;
                    reported_cost(state, rule, request, &forwarded).await;
                    forwarded.map(|_| Outcome::Forward)
                }
            }
        }
        Decision::Delay => state.schedule(acting, publish_time, now).await.map(|_| Outcome::Delay),
        Decision::Park => {
            park(state, acting, (request, unsent, reserved), publish_time).await.map(|()| Outcome::Parked)
        }
    };
    let (done, reserved) = match done {
        // Never dropped, never hot-retried: no slot of the key (or of the budget the rule's
        // feedback names) before a pause ends, and the event's new slot goes to Cloud Tasks.
        Err(Failure::Wait(wait)) => {
            let rescheduler =
                Rescheduler { store: &*state.store, metrics: &state.metrics, tasks: state.task_batcher()? };
            let task = async |moved: &Reserved| {
                let acting = Acting { slot: moved.reservation.slot, ..acting };
                state.task_for(acting, publish_time, moved.now).await
            };
            let (moved, done) = rescheduler.after_wait((rule, request), &wait, task).await;
            (done.map(|()| Outcome::Delay), moved.unwrap_or(*reserved))
        }
        done => (done, *reserved),
    };
    let slot = reserved.reservation.slot;
    match done {
        Ok(outcome) => Ok((outcome, reserved)),
        Err(Failure::Transient(error)) => Err(error),
        Err(Failure::Wait(wait)) => Err(anyhow::anyhow!("{} again", wait.detail)),
        Err(Failure::Permanent(refused)) => {
            if refused.reason != DlqReason::MaxDelayExceeded {
                tracing::error!(message_id = %event.id, rule = %rule.name, reason = %refused.reason, detail = %refused.detail, "no retry can deliver this event: dead-lettered");
            }
            state
                .dead_letter(letter(event, Some(rule), Some(key), refused.reason, &refused.detail, Some(slot)))
                .await?;
            Ok((Outcome::DeadLetter(refused.reason), reserved))
        }
    }
}

fn letter<'a>(
    event: &'a Event,
    rule: Option<&'a Rule>,
    key: Option<&'a str>,
    reason: DlqReason,
    detail: &'a str,
    scheduled_for: Option<Millis>,
) -> DeadLetter<'a> {
    DeadLetter {
        rule,
        key,
        reason,
        detail,
        scheduled_for,
        message_id: Some(&event.id),
        subscription: event.subscription.as_deref(),
        attributes: &event.attributes,
        data: &event.data,
    }
}

/// One line per decision; alarming dead letters (`max_delay_exceeded`: an upstream flood) are ERRORs.
fn log_decision(
    event: &Event,
    rule: Option<&Rule>,
    key: Option<&str>,
    outcome: Outcome,
    reservation: Option<&Reservation>,
    replayed: bool,
) {
    // A shadow rule's decision is what enforcing would have done; its event was forwarded.
    let shadow = rule.is_some_and(|r| r.mode == Mode::Shadow);
    let rule = rule.map_or("-", |r| r.name.as_str());
    let key = key.unwrap_or("-");
    let decision = outcome.as_str();
    let subscription = event.subscription.as_deref().unwrap_or("-");
    let (scheduled_for, delay_ms) = match reservation {
        Some(r) => (format_rfc3339(r.slot), r.slot - r.decided_at),
        None => (String::new(), 0),
    };
    if shadow {
        tracing::info!(message_id = %event.id, subscription, rule, key, decision, scheduled_for, delay_ms, replayed, shadow, "shadow decision: forwarded at once");
    } else if matches!(outcome, Outcome::DeadLetter(reason) if reason.is_alarming()) {
        tracing::error!(message_id = %event.id, subscription, rule, key, decision, scheduled_for, delay_ms, replayed, "event dead-lettered");
    } else {
        tracing::info!(message_id = %event.id, subscription, rule, key, decision, scheduled_for, delay_ms, replayed, "decision");
    }
}

/// A cost the forward URL reported after the call corrects what the event booked; failing to
/// record it is only logged (the event was delivered, and its booking stands).
async fn reported_cost(
    state: &AppState,
    rule: &Rule,
    request: &SlotRequest<'_>,
    forwarded: &Result<Option<u64>, Failure>,
) {
    let Ok(Some(actual)) = forwarded else { return };
    if let Err(error) = drip_service::costs::correct(&*state.store, &state.metrics, &rule.name, request, *actual).await
    {
        tracing::warn!(rule = %rule.name, key = request.key, %error, "could not correct the event's cost");
    }
}

/// The key is throttled and the event waits unbooked in its queue: the task body it would have had
/// is kept for the key's drain (`parking::park`) and the drain's wake armed. `unsent`: its body,
/// built before the call and too large for it to carry.
async fn park(
    state: &AppState,
    acting: Acting<'_>,
    (request, unsent, reserved): (&SlotRequest<'_>, Option<&[u8]>, &Reserved),
    publish_time: Option<&str>,
) -> Result<(), Failure> {
    // The body the call kept is the one it carried; else the one built before it and not sent, or
    // one built now, to be kept after.
    let built;
    let body = match request.parked_body.filter(|_| reserved.body_kept(request)).or(unsent) {
        Some(body) => body,
        None => {
            built = state.task_for(acting, publish_time, reserved.now).await?;
            &built.body[..]
        }
    };
    let tasks = state.task_batcher().map_err(Failure::transient)?.tasks();
    let tools = (&*state.store, tasks, &*state.metrics);
    drip_service::parking::park(tools, (acting.rule, request), reserved, body).await.map_err(Failure::transient)
}
