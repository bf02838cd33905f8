//! `POST /dispatch`: one task in, one overflow message out.

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use drip_core::overflow::{Payload, TaskBody};
use drip_core::rules::{OverflowFormat, Rule};
use drip_core::time::{DAY, parse_rfc3339, system_time_to_millis};
use drip_store::{claim_check, entity_prefix};
use redis::AsyncCommands;

use crate::AppState;

/// Cloud Tasks sets these on every dispatch; a request without them did not come from a queue.
const TASK_HEADERS: [&str; 2] = ["x-cloudtasks-queuename", "x-cloudtasks-taskname"];

pub async fn dispatch(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if let Some(missing) = TASK_HEADERS.iter().find(|h| !headers.contains_key(**h)) {
        tracing::warn!(header = missing, "dispatch refused: not a Cloud Tasks request");
        state.metrics.count("-", "not_a_task");
        return StatusCode::FORBIDDEN;
    }
    let task = headers.get("x-cloudtasks-taskname").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let retry_count =
        headers.get("x-cloudtasks-taskretrycount").and_then(|v| v.to_str().ok()).unwrap_or("0").to_owned();
    let body: TaskBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => return dead_letter_malformed(&state, &task, &body, &error.to_string()).await,
    };
    let meta = &body.rate_limit_meta;
    let Some(rule) = owner_of(&state, &meta.rule, &meta.overflow_topic) else {
        tracing::error!(task, topic = %meta.overflow_topic, rule = %meta.rule, "dispatch refused: no configured rule owns this overflow topic");
        state.metrics.count(&meta.rule, "unknown_overflow_topic");
        return StatusCode::FORBIDDEN;
    };
    match publish_overflow(&state, rule, &body).await {
        Ok(outcome) => {
            let now = system_time_to_millis(SystemTime::now()).unwrap_or(0);
            let lateness = parse_rfc3339(&meta.scheduled_for).map(|slot| now - slot).unwrap_or(0);
            if outcome == "published" {
                state.metrics.observe(&rule.name, lateness.max(0) as f64 / 1_000.0);
            }
            tracing::info!(task, retry_count, message_id = %body.message_id, rule = %rule.name, key = %meta.key, outcome, lateness_ms = lateness, "dispatched");
            state.metrics.count(&rule.name, outcome);
            StatusCode::OK
        }
        Err(error) => {
            tracing::warn!(task, retry_count, error = format!("{error:#}"), "dispatch failed; Cloud Tasks will retry");
            state.metrics.count(&rule.name, "retry");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// The rule named in the task, if it owns the topic; else any rule that owns it. Never a topic no
/// rule names: the body is only as trustworthy as whoever could create a task.
fn owner_of<'a>(state: &'a AppState, rule: &str, topic: &str) -> Option<&'a Rule> {
    let owners = || state.rules.rules.iter().filter(|r| r.overflow_topic == topic);
    owners().find(|r| r.name == rule).or_else(|| owners().next())
}

fn dispatched_key(state: &AppState, body: &TaskBody) -> String {
    let meta = &body.rate_limit_meta;
    format!("{}:dispatched:{}", entity_prefix(&state.namespace, &meta.rule, &meta.key), body.message_id)
}

async fn publish_overflow(state: &AppState, rule: &Rule, body: &TaskBody) -> anyhow::Result<&'static str> {
    let mut redis = state.redis.clone();
    let marker = dispatched_key(state, body);
    let seen: bool = state.metrics.time("redis", redis.exists(&marker)).await?;
    if seen {
        return Ok("duplicate");
    }
    let data = match body.payload().map_err(anyhow::Error::msg)? {
        Payload::Inline(data) => data,
        Payload::ClaimCheck(reference) => {
            match state.metrics.time("redis", claim_check::get(&mut redis, reference)).await? {
                Some(data) => data,
                None => {
                    // Retrying cannot bring it back: dead-letter the task body, which names the event.
                    let topic =
                        state.rules.dlq_topic_for(Some(rule)).ok_or_else(|| anyhow::anyhow!("no dead-letter topic"))?;
                    let attributes = BTreeMap::from([
                        ("drip-reason".to_owned(), "claim_check_missing".to_owned()),
                        ("drip-message-id".to_owned(), body.message_id.clone()),
                        ("drip-rule".to_owned(), rule.name.clone()),
                        ("drip-key".to_owned(), body.rate_limit_meta.key.clone()),
                    ]);
                    let task_body = serde_json::to_vec(body)?;
                    state.metrics.time("pubsub", state.publishers.publish(topic, task_body, attributes)).await?;
                    tracing::error!(message_id = %body.message_id, reference, "claim-checked payload expired: task dead-lettered");
                    return Ok("claim_check_missing");
                }
            }
        }
    };
    let message = match rule.overflow_format {
        OverflowFormat::Original => data,
        OverflowFormat::Enriched => {
            let mut enriched = body.clone().with_data(&data);
            enriched.claim_check = None;
            serde_json::to_vec(&enriched)?
        }
    };
    let meta = &body.rate_limit_meta;
    let mut attributes: BTreeMap<String, String> = body.attributes.clone();
    attributes.insert("isRatelimited".into(), "true".into());
    attributes.insert("drip-message-id".into(), body.message_id.clone());
    attributes.insert("drip-rule".into(), rule.name.clone());
    attributes.insert("drip-key".into(), meta.key.clone());
    attributes.insert("drip-scheduled-for".into(), meta.scheduled_for.clone());
    state.metrics.time("pubsub", state.publishers.publish(&rule.overflow_topic, message, attributes)).await?;
    // A second dispatch of this task (Cloud Tasks runs one twice, rarely) is then answered 200
    // without publishing again; consumers still deduplicate by drip-message-id for the race.
    let marked: redis::RedisResult<()> = redis.pset_ex(&marker, 1, DAY as u64).await;
    if let Err(error) = marked {
        tracing::warn!(%error, "could not record the dispatch");
    }
    Ok("published")
}

/// A body that is not a task of ours can never succeed: dead-letter it and stop the retries.
async fn dead_letter_malformed(state: &AppState, task: &str, body: &[u8], error: &str) -> StatusCode {
    let Some(topic) = state.rules.fallback_dlq_topic() else {
        tracing::error!(task, error, "malformed task body and no default_dlq_topic to dead-letter it");
        return StatusCode::BAD_REQUEST;
    };
    let attributes = BTreeMap::from([
        ("drip-reason".to_owned(), "malformed_task".to_owned()),
        ("drip-detail".to_owned(), error.chars().take(1_000).collect()),
        ("drip-task".to_owned(), task.to_owned()),
    ]);
    match state.metrics.time("pubsub", state.publishers.publish(topic, body.to_vec(), attributes)).await {
        Ok(_) => {
            tracing::error!(task, error, "malformed task body dead-lettered");
            state.metrics.count("-", "malformed_task");
            StatusCode::OK
        }
        Err(error) => {
            tracing::warn!(task, %error, "could not dead-letter a malformed task");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}
