//! `POST /push`: one Pub/Sub message in, one action out, acked (204) only once the action is done.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use drip_core::event::Event;
use drip_core::routing::{Decision, DlqReason, Plan, plan};
use drip_core::rules::Rule;
use drip_core::time::format_rfc3339;
use drip_store::{SlotRequest, SlotStore};

use crate::AppState;
use crate::actions::{DeadLetter, Forwarded, Scheduled, Transient};
use crate::envelope::{self, PushedMessage};

/// 204 once the event is forwarded, scheduled or dead-lettered; 503 when any of that failed
/// transiently. Never 202: the Pub/Sub emulator takes it for a nack.
pub async fn push(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let result = match envelope::parse(&headers, &body) {
        Ok(message) => handle(&state, message).await,
        Err(unusable) => {
            tracing::warn!(reason = unusable.reason, detail = %unusable.detail, "unusable push request");
            state.metrics.count("-", unusable.reason);
            state
                .dead_letter(DeadLetter {
                    rule: None,
                    key: None,
                    reason: unusable.reason,
                    detail: &unusable.detail,
                    scheduled_for: None,
                    message_id: unusable.message_id.as_deref(),
                    attributes: &unusable.attributes,
                    data: &unusable.data,
                })
                .await
        }
    };
    match result {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(Transient(error)) => {
            tracing::warn!(error = format!("{error:#}"), "push failed; Pub/Sub will redeliver");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

async fn handle(state: &AppState, message: PushedMessage) -> Result<(), Transient> {
    let PushedMessage { id, publish_time, attributes, data } = message;
    let event = Event::new(id, attributes, data);
    let (rule, key, cost) = match plan(&state.rules, &event) {
        Plan::Reserve { rule, key, cost } => (rule, key, cost),
        Plan::DeadLetter { rule, key, reason, detail } => {
            log_decision(&event, rule, key.as_deref(), reason.as_str(), None, false);
            let letter = DeadLetter {
                rule,
                key: key.as_deref(),
                reason: reason.as_str(),
                detail: &detail,
                scheduled_for: None,
                message_id: Some(&event.id),
                attributes: &event.attributes,
                data: &event.data,
            };
            state.dead_letter(letter).await?;
            state.metrics.count(rule.map_or("-", |r| r.name.as_str()), reason.as_str());
            return Ok(());
        }
    };
    let request = SlotRequest::for_rule(rule, &key, &event.id, cost, None);
    let reserved = state.metrics.time("redis", state.store.reserve(&request)).await?;
    let reservation = reserved.reservation;
    if reservation.replayed && reservation.completed {
        tracing::info!(message_id = %event.id, rule = %rule.name, key, "redelivery of a message already acted upon: acked");
        state.metrics.count(&rule.name, "redelivered");
        return Ok(());
    }
    let decision = Decision::of(&reservation, rule.inline_wait);
    log_decision(
        &event,
        Some(rule),
        Some(&key),
        decision_name(decision),
        Some((reservation.slot, reservation.decided_at)),
        reservation.replayed,
    );
    let dead_letter = |reason: &'static str, detail: String, scheduled_for| {
        let (rule, key, event) = (rule, key.clone(), &event);
        async move {
            let letter = DeadLetter {
                rule: Some(rule),
                key: Some(&key),
                reason,
                detail: &detail,
                scheduled_for,
                message_id: Some(&event.id),
                attributes: &event.attributes,
                data: &event.data,
            };
            state.dead_letter(letter).await
        }
    };
    let outcome = match decision {
        Decision::DeadLetter(reason) => {
            let detail = format!("the earliest slot {} is beyond max_delay", format_rfc3339(reservation.slot));
            dead_letter(reason.as_str(), detail, Some(reservation.slot)).await?;
            reason.as_str()
        }
        Decision::Forward => {
            let wait = (reservation.slot - reserved.now).clamp(0, rule.inline_wait);
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            match state.forward(rule, &key, &event, reservation.slot).await? {
                Forwarded::Done => "forward",
                Forwarded::Rejected(detail) => {
                    tracing::error!(message_id = %event.id, rule = %rule.name, %detail, "forward target rejected the event");
                    dead_letter("forward_rejected", detail, Some(reservation.slot)).await?;
                    "forward_rejected"
                }
            }
        }
        Decision::Delay => {
            match state.schedule(rule, &key, &event, publish_time.as_deref(), reservation.slot, reserved.now).await? {
                Scheduled::Created | Scheduled::AlreadyExisted => "delay",
                Scheduled::TooLarge(size) => {
                    let detail = format!("{size} bytes: too large for a task and over DRIP_CLAIM_CHECK_MAX_BYTES");
                    dead_letter("payload_too_large", detail, Some(reservation.slot)).await?;
                    "payload_too_large"
                }
            }
        }
    };
    if !reservation.replayed && outcome != DlqReason::MaxDelayExceeded.as_str() {
        let delay = (reservation.slot - reservation.decided_at) as f64 / 1_000.0;
        state.metrics.observe(&rule.name, delay);
    }
    state.metrics.count(&rule.name, outcome);
    // Acting twice on a redelivery is what this prevents; failing to record it only risks that.
    if let Err(error) = state.metrics.time("redis", state.store.complete(&request)).await {
        tracing::warn!(message_id = %event.id, %error, "could not record the message as acted upon");
    }
    Ok(())
}

fn decision_name(decision: Decision) -> &'static str {
    match decision {
        Decision::DeadLetter(reason) => reason.as_str(),
        other => other.as_str(),
    }
}

/// One line per decision; `max_delay_exceeded` is an ERROR, since it means an upstream flood.
fn log_decision(
    event: &Event,
    rule: Option<&Rule>,
    key: Option<&str>,
    decision: &str,
    slot: Option<(i64, i64)>,
    replayed: bool,
) {
    let rule = rule.map_or("-", |r| r.name.as_str());
    let key = key.unwrap_or("-");
    let (scheduled_for, delay_ms) = match slot {
        Some((slot, decided_at)) => (format_rfc3339(slot), slot - decided_at),
        None => (String::new(), 0),
    };
    if decision == DlqReason::MaxDelayExceeded.as_str() {
        tracing::error!(message_id = %event.id, rule, key, decision, scheduled_for, delay_ms, replayed, "event dead-lettered: beyond max_delay");
    } else {
        tracing::info!(message_id = %event.id, rule, key, decision, scheduled_for, delay_ms, replayed, "decision");
    }
}
