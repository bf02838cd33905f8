//! An entity's state and its per-entity limits, on the limiter's API (same authentication as
//! `/push`):
//!
//! - `GET /v1/rules/{rule}/keys/{key}`: what `drip inspect --json` prints;
//! - `GET /v1/rules/{rule}/keys/{key}/limits`: its overrides;
//! - `GET /v1/rules/{rule}/limits`: every key of the rule with overrides, and them;
//! - `GET /v1/rules/{rule}/history?count=20`: the rule's audit list, newest first;
//! - `PUT /v1/rules/{rule}/keys/{key}/limits` `{"limit": "500/1m", "window"?: "fixed", "until"?: RFC 3339}`:
//!   sets one, from the next reservation on;
//! - `DELETE /v1/rules/{rule}/keys/{key}/limits?per=1m[&window=fixed]`: removes one;
//! - `PUT /v1/rules/{rule}/keys/{key}/pause` `{"for": "15m", "reason"?}`: pauses the key (at most 7 days);
//! - `DELETE /v1/rules/{rule}/keys/{key}/pause[?reason=...]`: lifts the key's pause;
//! - `PUT` and `DELETE /v1/rules/{rule}/budgets/{budget}/pause`: the same for a budget.
//!
//! Each change is logged (who, what, before, after) and kept in the rule's audit list. A body or
//! query with a field these routes do not know is refused (400, naming it): a misspelt `until`
//! must not set a limit with no end.
//!
//! - `POST /v1/feedback` `{"rule", "key" | "budget", "status", "retryAfter"?}`: an overflow consumer
//!   that called the downstream itself reports its answer, with the effect the limiter's own
//!   forwards have (`drip_service::feedback`): a 429 or 503 with `retryAfter` (seconds) pauses the
//!   key (or the budget the rule's feedback names, or the one given); a 429, 408, 5xx or a timeout
//!   (status 0) lowers an adaptive level.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use drip_core::budgets::{Budget, LatencyReport, PPM};
use drip_core::event::MessageRef;
use drip_core::rules::{Classes, Limit, Rule};
use drip_core::schedule::{Correction, LimitOverride};
use drip_core::template::cap_key;
use drip_core::time::{format_rfc3339, parse_rfc3339, wall_clock_millis};
use drip_service::api_error::{ApiJson, ApiQuery};
use drip_service::auth::Caller;
use drip_service::feedback;
use drip_service::live_rules::LoadedRules;
use drip_store::inspect::{KeyOverrides, override_reports};
use drip_store::{FeedbackChange, OverrideChange, SlotRequest};
use serde::Deserialize;

use crate::AppState;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    drip_service::api_error::api_error(status, message)
}

/// Who called, for the logs and the audit: the verified email, or `anonymous` without OIDC.
fn caller_name(caller: Option<axum::Extension<Caller>>) -> String {
    caller.map_or_else(|| "anonymous".to_owned(), |axum::Extension(Caller(email))| email)
}

/// The rule a `/v1/rules/{rule}/...` path names, among the rules in force (404 when none), and the
/// key of a `.../keys/{key}` path, capped as the limiter caps keys.
pub struct PathTarget {
    rules: Arc<LoadedRules>,
    index: usize,
    key: String,
}

impl PathTarget {
    pub(crate) fn rule(&self) -> &Rule {
        &self.rules.rules[self.index]
    }

    /// The key the path names, capped as the limiter caps keys.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The rule named `name` among the rules in force (none: 404, [`no_such_rule`]), and `key` capped.
    pub(crate) fn named(state: &AppState, name: &str, key: &str) -> Option<Self> {
        let rules = state.rules.current();
        let index = rules.rule_index(name)?;
        Some(Self { rules, index, key: cap_key(key.to_owned()) })
    }
}

pub(crate) fn no_such_rule() -> Response {
    error(StatusCode::NOT_FOUND, "no such rule")
}

impl PathTarget {}

impl FromRequestParts<AppState> for PathTarget {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| error(rejection.status(), rejection.body_text()))?;
        let name = params.get("rule").map_or("", String::as_str);
        Self::named(state, name, params.get("key").map_or("", String::as_str)).ok_or_else(no_such_rule)
    }
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> Response {
    tracing::warn!(%error, "{what} failed");
    self::error(StatusCode::SERVICE_UNAVAILABLE, "redis unavailable")
}

/// A key of a rule with classes (not one class of it) is reported as its classes together.
pub async fn inspect(State(state): State<AppState>, target: PathTarget) -> Response {
    let report = match drip_store::inspect_key(&*state.store, target.rule(), &target.key).await {
        Ok(report) => drip_store::with_provenance(&*state.store, target.rule(), report).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => Json(report).into_response(),
        Err(e) => unavailable("inspect", e),
    }
}

pub async fn get_limits(State(state): State<AppState>, target: PathTarget) -> Response {
    let rule = target.rule();
    match state.store.overrides(rule, &target.key).await {
        Ok(overrides) => Json(override_reports(rule, &overrides, wall_clock_millis())).into_response(),
        Err(e) => unavailable("reading overrides", e),
    }
}

pub async fn list_limits(State(state): State<AppState>, target: PathTarget) -> Response {
    let rule = target.rule();
    match state.store.list_overrides(rule).await {
        Ok(all) => {
            let now = wall_clock_millis();
            let each = all.into_iter().map(|(key, o)| KeyOverrides { overrides: override_reports(rule, &o, now), key });
            Json(each.collect::<Vec<_>>()).into_response()
        }
        Err(e) => unavailable("listing overrides", e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    count: Option<usize>,
}

/// The most entries one history answer holds.
const MAX_HISTORY: usize = 1_000;

pub async fn history(
    State(state): State<AppState>,
    target: PathTarget,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> Response {
    let rule = target.rule();
    let count = query.count.unwrap_or(20).min(MAX_HISTORY);
    match state.store.audit_history(rule, count).await {
        Ok(entries) => Json(entries).into_response(),
        Err(e) => unavailable("reading the audit list", e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLimit {
    /// `COUNT/PERIOD`, e.g. `500/1m`.
    pub(crate) limit: String,
    pub(crate) window: Option<String>,
    /// RFC 3339. None: the replaced override's end, if it had one (`forever: true` drops it).
    pub(crate) until: Option<String>,
    #[serde(default)]
    pub(crate) forever: bool,
    /// Why, kept in the rule's audit list.
    pub(crate) reason: Option<String>,
}

pub async fn put_limit(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    ApiJson(body): ApiJson<SetLimit>,
) -> Response {
    let (rule, key) = (target.rule(), &target.key);
    let (limit, count) = match rule.override_target(&body.limit, body.window.as_deref()) {
        Ok(target) => target,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let until = match body.until.as_deref().map(parse_rfc3339).transpose() {
        Ok(until) => until,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("until: {e}")),
    };
    let current = match state.store.overrides(rule, key).await {
        Ok(overrides) => overrides.get(&drip_core::schedule::override_id(limit)).copied(),
        Err(e) => return unavailable("reading the key's overrides", e),
    };
    let set = match LimitOverride::replacing(current, count, (until, body.forever), wall_clock_millis()) {
        Ok(set) => set,
        Err(message) => return error(StatusCode::BAD_REQUEST, format!("until: {message}")),
    };
    change(&state, caller, (rule, key, limit), Some(set), body.reason.as_deref()).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhichLimit {
    /// The overridden limit's period, e.g. `1m`.
    pub(crate) per: String,
    pub(crate) window: Option<String>,
    /// Why, kept in the rule's audit list.
    pub(crate) reason: Option<String>,
}

pub async fn delete_limit(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    ApiQuery(which): ApiQuery<WhichLimit>,
) -> Response {
    let rule = target.rule();
    let limit = match rule.override_target(&format!("1/{}", which.per), which.window.as_deref()) {
        Ok((limit, _)) => limit,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    change(&state, caller, (rule, &target.key, limit), None, which.reason.as_deref()).await
}

async fn change(
    state: &AppState,
    caller: Option<axum::Extension<Caller>>,
    (rule, key, limit): (&Rule, &str, &Limit),
    set: Option<LimitOverride>,
    reason: Option<&str>,
) -> Response {
    let by = caller_name(caller);
    match state.store.change_override(rule, key, limit, set, drip_store::Author { by: &by, reason }).await {
        Ok(change) => {
            log_change(&change);
            Json(change).into_response()
        }
        Err(e) => unavailable("changing an override", e),
    }
}

fn log_change(change: &OverrideChange) {
    let show = |o: &Option<drip_store::OverrideView>| {
        o.map_or("the rule's".to_owned(), |o| match o.until {
            Some(until) => format!("{} until {}", o.limit, format_rfc3339(until)),
            None => o.limit.to_string(),
        })
    };
    tracing::info!(
        by = %change.by,
        rule = %change.rule,
        key = %change.key,
        limit = %change.limit,
        before = %show(&change.before),
        after = %show(&change.after),
        "limit override changed"
    );
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Feedback {
    rule: String,
    key: Option<String>,
    budget: Option<String>,
    /// The downstream's answer; none for a report of a cost alone.
    status: Option<u16>,
    /// Seconds, as the downstream's `Retry-After` said.
    retry_after: Option<u64>,
    /// What the call really cost (a count of the rule's units), for the message named by
    /// `messageId`, `subscription` and `published` (its `drip-*` attributes).
    cost: Option<u64>,
    message_id: Option<String>,
    subscription: Option<String>,
    published: Option<String>,
    /// How long the downstream took (ms): one call's latency, or with `calls` a window's high
    /// percentile over that many calls, for an adaptive limit that follows latency.
    latency_ms: Option<f64>,
    calls: Option<u64>,
    /// The downstream's answer's headers (name: value), for a rule that learns its limits from
    /// them (`learn: headers`): `RateLimit-Policy`, `RateLimit`, `X-RateLimit-*`, `Retry-After`.
    headers: Option<std::collections::BTreeMap<String, String>>,
}

/// `POST /v1/feedback` with `latencyMs`: one call joins its window (judged when the window ends);
/// a window's percentile with its `calls` is judged now.
async fn report_latency(
    state: &AppState,
    rule: &Rule,
    key: &str,
    budget: Option<&Budget>,
    body: &Feedback,
) -> Response {
    let Some(ms) = body.latency_ms.filter(|ms| ms.is_finite() && *ms >= 0.0) else {
        return error(StatusCode::BAD_REQUEST, "latencyMs must be a number of milliseconds, 0 or more");
    };
    if drip_service::latency::latency_control(rule, budget).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "the adaptive limit of rule '{}' (or of the budget its feedback names) does not follow latency: add adaptive.latency",
                rule.name
            ),
        );
    }
    let micros = (ms * 1_000.0).round() as u64;
    let Some(calls) = body.calls else {
        let (store, metrics) = (&*state.store, &*state.metrics);
        state.latency.record((store, metrics), (rule, key, budget), std::time::Duration::from_micros(micros)).await;
        return (StatusCode::ACCEPTED, Json(serde_json::json!({ "latency": "recorded" }))).into_response();
    };
    let report = LatencyReport { percentile: micros, calls };
    match drip_service::latency::report_to_store((&*state.store, &state.metrics), rule, key, budget, report).await {
        Ok(change) => Json(serde_json::json!({
            "latency": "judged",
            "verdict": change.map(|c| drip_service::latency::verdict_name(c.verdict)),
            "levelBefore": change.map(|c| c.before as f64 / PPM as f64),
            "level": change.map(|c| c.after as f64 / PPM as f64),
        }))
        .into_response(),
        Err(e) => unavailable("latency report", e),
    }
}

/// `POST /v1/feedback` with a `cost`: what the message's call really cost corrects what it booked,
/// once (`drip_service::costs`), audited.
async fn report_cost(state: &AppState, rule: &Rule, key: &str, body: &Feedback, by: &str) -> Response {
    let (Some(actual), Some(message_id), Some(published)) = (body.cost, &body.message_id, &body.published) else {
        return error(StatusCode::BAD_REQUEST, "a cost names its message: messageId, published (and subscription)");
    };
    let Ok(published_at) = parse_rfc3339(published) else {
        return error(StatusCode::BAD_REQUEST, format!("published: '{published}' is not an RFC 3339 time"));
    };
    let identity = MessageRef::new(message_id.clone(), body.subscription.clone()).identity();
    let request = SlotRequest::for_rule(rule, key, &identity, 1).published(Some(published_at));
    let correction =
        match drip_service::costs::correct(&*state.store, &state.metrics, &rule.name, &request, actual).await {
            Ok(correction) => correction,
            Err(e) => return unavailable("cost report", e),
        };
    let (booked, outcome) = match correction {
        Correction::Applied { booked, .. } => (Some(booked), "applied"),
        Correction::Already => (None, "already"),
        Correction::Unknown => (None, "unknown"),
    };
    tracing::info!(%by, rule = %rule.name, key, message_id, actual, booked, outcome, "cost reported");
    let change = drip_store::CostChange {
        at: wall_clock_millis(),
        by: by.to_owned(),
        rule: rule.id.clone(),
        key: key.to_owned(),
        message_id: message_id.clone(),
        booked,
        actual,
        outcome: outcome.to_owned(),
    };
    if let Err(error) = state.store.record_audit(&drip_store::AuditEntry::Cost(change)).await {
        tracing::warn!(%error, rule = %rule.name, key, "could not keep the cost report in the audit list");
    }
    let status = if correction == Correction::Unknown { StatusCode::NOT_FOUND } else { StatusCode::OK };
    (status, Json(serde_json::json!({ "outcome": outcome, "booked": booked, "actual": actual }))).into_response()
}

pub async fn feedback(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    ApiJson(body): ApiJson<Feedback>,
) -> Response {
    let rules = state.rules.current();
    let Some(rule) = rules.rule(&body.rule) else { return error(StatusCode::NOT_FOUND, "no such rule") };
    let budget = match &body.budget {
        None => None,
        Some(name) => match rule.budget(name) {
            Some(budget) => Some(budget),
            None => {
                return error(StatusCode::BAD_REQUEST, format!("rule '{}' draws from no budget '{name}'", rule.name));
            }
        },
    };
    let key = match (body.key.clone(), budget) {
        (Some(key), _) => cap_key(key),
        (None, Some(_)) => String::new(),
        (None, None) => return error(StatusCode::BAD_REQUEST, "give a key or a budget"),
    };
    if let Some(headers) = &body.headers {
        if rule.learn.is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                format!("rule '{}' does not learn from the partner's headers: add learn: headers", rule.name),
            );
        }
        if body.key.is_none() {
            return error(StatusCode::BAD_REQUEST, "headers are learned per key: give the key");
        }
        let now = wall_clock_millis();
        let says = drip_core::partner::read(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())), now);
        let delivered = body.status.is_none_or(|status| (200..300).contains(&status));
        let learned =
            drip_service::learn::act((&*state.store, &state.metrics), (rule, &key), &says, delivered, now).await;
        if body.status.is_none() && body.cost.is_none() && body.latency_ms.is_none() {
            let limits: Vec<_> = learned
                .limits
                .iter()
                .map(|(limit, count, until)| serde_json::json!({ "limit": limit, "count": count, "until": format_rfc3339(*until) }))
                .collect();
            return Json(serde_json::json!({
                "pausedUntil": learned.paused_until.map(format_rfc3339),
                "learned": limits,
                "ignored": says.ignored,
            }))
            .into_response();
        }
    }
    if body.latency_ms.is_some() || body.calls.is_some() {
        if body.status.is_some() || body.cost.is_some() || body.calls.is_some() && body.latency_ms.is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                "report a latency on its own: latencyMs (and calls), without a status or a cost",
            );
        }
        return report_latency(&state, rule, &key, budget, &body).await;
    }
    let status = match (body.status, body.cost) {
        (Some(status), _) => status,
        (None, Some(_)) if budget.is_none() => {
            return report_cost(&state, rule, &key, &body, &caller_name(caller)).await;
        }
        (None, _) => return error(StatusCode::BAD_REQUEST, "give a status, or a key's message and its cost"),
    };
    if body.cost.is_some() {
        return error(StatusCode::BAD_REQUEST, "report a cost on its own, without a status");
    }
    // Only a 429 or 503 that says how long to wait pauses (a wait of 0 s is no pause: lifting one
    // is `DELETE .../pause`); a 429, 408, 5xx or a timeout (status 0 or 504) lowers an adaptive
    // limit; anything else changes nothing.
    let until = match (status, body.retry_after) {
        (429 | 503, Some(seconds)) if seconds > 0 => Some(drip_gcp::http_target::wait_seconds(seconds)),
        _ => None,
    };
    let signal = feedback::Signal { status: (status != 0).then_some(status), until };
    // A key's pause before this answer, for the audit. A key Drip has not seen yet may be paused
    // too (an operator who hears of an outage first): its state then holds the pause alone, kept
    // as long as the pause is in force.
    let before = match budget.or(rule.feedback_budget()) {
        Some(_) => None,
        None => match state.store.paused_until(rule, &key).await {
            Ok(before) => before,
            Err(e) => return unavailable("feedback", e),
        },
    };
    let by = caller_name(caller);
    match feedback::apply((&*state.store, &state.metrics), rule, &key, budget, signal).await {
        Ok(effect) => {
            // Audited like an override change: who, what, before and after, logged and kept in
            // the rule's audit list (`drip limits history`).
            tracing::warn!(%by, rule = %rule.name, key, target = %effect.target, status, retry_after = body.retry_after, paused_before = before.map(format_rfc3339), paused_after = effect.paused_until.map(format_rfc3339), adaptive_level = effect.adaptive_level, "feedback");
            let change = FeedbackChange {
                at: wall_clock_millis(),
                by: by.to_owned(),
                rule: rule.id.clone(),
                key: key.clone(),
                target: effect.target.clone(),
                status,
                retry_after: body.retry_after,
                paused_before: before,
                paused_after: effect.paused_until,
                adaptive_level: effect.adaptive_level,
            };
            // The signal is applied: a lost audit entry is logged, not answered with a 5xx that
            // would make the consumer report it again.
            if let Err(error) = state.store.record_audit(&drip_store::AuditEntry::Feedback(change)).await {
                tracing::warn!(%error, rule = %rule.name, key, "could not keep the feedback call in the audit list");
            }
            if effect.paused_until.is_none() && effect.adaptive_level.is_none() {
                return StatusCode::NO_CONTENT.into_response();
            }
            Json(serde_json::json!({
                "target": effect.target,
                "pausedUntil": effect.paused_until.map(format_rfc3339),
                "askedUntil": effect.asked_until.map(format_rfc3339),
                "maxPause": effect.asked_until.map(|_| drip_core::time::format_duration(rule.max_pause)),
                "adaptiveLevel": effect.adaptive_level,
            }))
            .into_response()
        }
        Err(e) => unavailable("feedback", e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeQuery {
    /// Why, kept in the rule's audit list.
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// How long from now, e.g. `15m` (at most 7 days).
    #[serde(rename = "for")]
    pub(crate) length: String,
    /// Why, kept in the rule's audit list.
    pub(crate) reason: Option<String>,
}

/// `PUT /v1/rules/{rule}/keys/{key}/pause` `{"for": "15m", "reason"?}`.
pub async fn pause_key(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    ApiJson(body): ApiJson<PauseBody>,
) -> Response {
    pause(&state, caller, (target.rule(), &target.key, None), &body).await
}

/// `PUT /v1/rules/{rule}/budgets/{budget}/pause` `{"for": "15m", "reason"?}`.
pub async fn pause_budget(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    Path(params): Path<HashMap<String, String>>,
    ApiJson(body): ApiJson<PauseBody>,
) -> Response {
    let rule = target.rule();
    match named_budget(rule, &params) {
        Ok(budget) => pause(&state, caller, (rule, "", Some(budget)), &body).await,
        Err(refused) => *refused,
    }
}

/// The budget a `.../budgets/{budget}/...` path names; 404 when the rule draws from none of that name.
fn named_budget<'r>(rule: &'r Rule, params: &HashMap<String, String>) -> Result<&'r Budget, Box<Response>> {
    let name = params.get("budget").map_or("", String::as_str);
    rule.budget(name).ok_or_else(|| {
        Box::new(error(StatusCode::NOT_FOUND, format!("rule '{}' draws from no budget '{name}'", rule.name)))
    })
}

async fn pause(
    state: &AppState,
    caller: Option<axum::Extension<Caller>>,
    (rule, key, budget): (&Rule, &str, Option<&Budget>),
    body: &PauseBody,
) -> Response {
    let length = match drip_core::time::parse_duration(&body.length) {
        Ok(length) if length > 0 && length <= drip_store::MAX_OPERATOR_PAUSE => length,
        Ok(_) => return error(StatusCode::BAD_REQUEST, "for: a pause lasts more than 0 s and at most 7d"),
        Err(message) => return error(StatusCode::BAD_REQUEST, format!("for: {message}")),
    };
    let by = caller_name(caller);
    let author = drip_store::Author { by: &by, reason: body.reason.as_deref() };
    match drip_store::pause(&*state.store, (rule, key, budget), length, author).await {
        Ok(paused) => {
            let change = &paused.change;
            tracing::warn!(by = %change.by, rule = %rule.name, key, target = %change.target, paused_until = %format_rfc3339(change.paused_until), reason = ?change.reason, "paused by an operator");
            Json(paused).into_response()
        }
        Err(e) => unavailable("pausing", e),
    }
}

/// `DELETE /v1/rules/{rule}/keys/{key}/pause`.
pub async fn resume_key(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    ApiQuery(query): ApiQuery<ResumeQuery>,
) -> Response {
    resume(&state, caller, (target.rule(), &target.key, None), query.reason.as_deref()).await
}

/// `DELETE /v1/rules/{rule}/budgets/{budget}/pause`.
pub async fn resume_budget(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    target: PathTarget,
    Path(params): Path<HashMap<String, String>>,
    ApiQuery(query): ApiQuery<ResumeQuery>,
) -> Response {
    let rule = target.rule();
    match named_budget(rule, &params) {
        Ok(budget) => resume(&state, caller, (rule, "", Some(budget)), query.reason.as_deref()).await,
        Err(refused) => *refused,
    }
}

async fn resume(
    state: &AppState,
    caller: Option<axum::Extension<Caller>>,
    (rule, key, budget): (&Rule, &str, Option<&Budget>),
    reason: Option<&str>,
) -> Response {
    let by = caller_name(caller);
    match drip_store::resume(&*state.store, rule, key, budget, drip_store::Author { by: &by, reason }).await {
        Ok(resumed) => {
            if budget.is_none() {
                wake_parked(state, rule, key).await;
            }
            let change = &resumed.change;
            tracing::warn!(by = %change.by, rule = %rule.name, key, target = %change.target, resumed_pause = change.resumed_pause.map(format_rfc3339), paused_until = resumed.paused_until.map(format_rfc3339), "pause lifted");
            Json(resumed).into_response()
        }
        Err(e) => unavailable("resuming", e),
    }
}

/// After a key's pause is lifted, its parked events drain now, at the rate in force, rather than
/// at the drain's next wake; a key of a rule with classes is paused for every class, so each
/// class's drain wakes. An instance that creates no task (the admin service) leaves them to that
/// wake, at most `MAX_WAKE_GAP` (30 s) away while events are parked.
async fn wake_parked(state: &AppState, rule: &Rule, key: &str) {
    let Some(batcher) = &state.tasks else {
        tracing::info!(rule = %rule.name, key, "pause lifted; this instance creates no task, so parked events drain at their next wake");
        return;
    };
    let entities = match rule.classes.as_ref().and_then(|classes| Some((classes, classes.class_entity(key)?))) {
        Some((classes, (scope, _))) => classes.names.iter().map(|class| Classes::entity(scope, class)).collect(),
        None => vec![key.to_owned()],
    };
    for entity in entities {
        wake_entity(state, batcher, rule, &entity).await;
    }
}

async fn wake_entity(state: &AppState, batcher: &drip_service::task_batches::TaskBatcher, rule: &Rule, key: &str) {
    match state.store.parked_bodies(rule, key, 1).await {
        Ok(parked) if parked.is_empty() => return,
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(rule = %rule.name, key, %error, "could not read the key's parked events; waking its drain anyway")
        }
    }
    let now = drip_core::time::wall_clock_millis();
    if let Err(error) = drip_service::parking::wake_at((batcher.tasks(), &state.metrics), (rule, key), now).await {
        tracing::warn!(rule = %rule.name, key, ?error, "pause lifted, but the wake of its parked events was not made");
    }
}
