//! The console's dead letters: look at what waits on a dead-letter subscription (a dry run: each
//! dead letter's rule, key, reason and what a replay would do; nothing is published or acked), and
//! replay the ones a filter picks (a reason, a rule, a key) to a topic, as `drip dlq replay` does:
//! idempotent by message, never a loop, everything left given back to the subscription.

use std::time::Duration;

use askama::Template;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use drip_core::outcome::DlqReason;
use drip_gcp::pull::Subscription;
use drip_service::dead_letters::{Counts, Entry, ReplayPlan, replay};
use serde::Deserialize;

use super::actions::{ConfirmPage, Hidden, posted_here, viewer_refused};
use super::{Caller, FormTokens, Refusal, given, render};
use crate::AppState;

/// What the page works with: the dead-letter subscriptions it reads, the topics it replays to
/// (full names), and the Pub/Sub emulator when there is one.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterSources {
    pub subscriptions: Vec<String>,
    pub topics: Vec<String>,
    pub emulator: Option<String>,
}

/// How many dead letters one look or replay goes through at most, and how long it waits for more.
const MOST: usize = 1_000;
const IDLE: Duration = Duration::from_secs(2);

#[derive(Template)]
#[template(path = "console/dead_letters.html")]
struct DeadLettersPage {
    caller: Caller,
    token: String,
    subscriptions: Vec<String>,
    topics: Vec<String>,
    reasons: Vec<&'static str>,
    rules: Vec<String>,
}

pub async fn page(State(state): State<AppState>, caller: Caller) -> Response {
    let token = match FormTokens::of(&state).await {
        Ok(tokens) => tokens.issue(&caller.email, drip_core::time::wall_clock_millis() as u64),
        Err(refusal) => return refusal.into_response(),
    };
    let sources = &state.dead_letters;
    render(&DeadLettersPage {
        caller,
        token,
        subscriptions: sources.subscriptions.clone(),
        topics: sources.topics.clone(),
        reasons: DlqReason::ALL.iter().map(|r| r.as_str()).collect(),
        rules: state.rules.current().rules.iter().map(|r| r.name.clone()).collect(),
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
    /// `look` (a dry run) or `replay`.
    #[serde(default)]
    mode: String,
    #[serde(default)]
    subscription: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    rule: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    max: String,
}

struct Row {
    action: &'static str,
    dead_letter: String,
    message_id: String,
    rule: String,
    key: String,
    reason: String,
    detail: String,
}

impl Row {
    fn of(entry: &Entry) -> Self {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        Self {
            action: entry.action.label(),
            dead_letter: entry.dead_letter.clone(),
            message_id: show(&entry.message_id),
            rule: show(&entry.rule),
            key: show(&entry.key),
            reason: show(&entry.reason),
            detail: match &entry.why {
                Some(why) => format!("{} [{why}]", entry.detail),
                None => entry.detail.clone(),
            },
        }
    }
}

#[derive(Template)]
#[template(path = "console/replayed.html")]
struct ReplayedPage {
    caller: Caller,
    summary: String,
    rows: Vec<Row>,
}

/// `POST /console/dead-letters`: a look for anyone, a replay for operators after a confirmation.
pub async fn run(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Form(form): Form<RunForm>,
) -> Response {
    if let Err(refusal) = posted_here(&state, &caller, &headers, &form.csrf).await {
        return refusal.into_response();
    }
    let dry_run = form.mode != "replay";
    if !dry_run && !caller.may_act() {
        return viewer_refused(&caller).into_response();
    }
    let sources = &state.dead_letters;
    if !sources.subscriptions.contains(&form.subscription) {
        let message = format!("'{}' is not among DRIP_CONSOLE_DLQ_SUBSCRIPTIONS", form.subscription);
        return Refusal::new(StatusCode::BAD_REQUEST, message).into_response();
    }
    if !dry_run && !sources.topics.contains(&form.topic) {
        let message = format!("'{}' is not among DRIP_CONSOLE_REPLAY_TOPICS", form.topic);
        return Refusal::new(StatusCode::BAD_REQUEST, message).into_response();
    }
    let max = match given(&form.max).map(|m| m.parse::<usize>()) {
        None => 100,
        Some(Ok(max)) if (1..=MOST).contains(&max) => max,
        Some(_) => {
            return Refusal::new(StatusCode::BAD_REQUEST, format!("max: a count from 1 to {MOST}")).into_response();
        }
    };
    let plan = ReplayPlan {
        subscription: form.subscription.clone(),
        topic: form.topic.clone(),
        reasons: given(&form.reason).into_iter().collect(),
        rule: given(&form.rule),
        key: given(&form.key),
        max,
        idle: IDLE,
        dry_run,
    };
    if !dry_run && form.confirm != "yes" {
        return confirm(caller, &plan, &form);
    }
    let subscription = match Subscription::new(&plan.subscription, sources.emulator.as_deref()) {
        Ok(subscription) => subscription,
        Err(error) => return Refusal::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    };
    let publish = &*state.publishers;
    let done = replay(&plan, (&subscription, publish), Some(&*state.store), std::future::pending(), |_| {}).await;
    let done = match done {
        Ok(done) => done,
        Err(error) => {
            tracing::warn!(%error, subscription = %plan.subscription, "console: a dead-letter run failed");
            return Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("{error:#}")).into_response();
        }
    };
    let c = Counts::of(&done.entries);
    let summary = if dry_run {
        format!("a look: {} would be replayed; all {} stay on {}", c.would, done.entries.len(), plan.subscription)
    } else {
        tracing::warn!(by = %caller.email, subscription = %plan.subscription, topic = %plan.topic, replayed = c.replayed, reasons = ?plan.reasons, rule = ?plan.rule, key = ?plan.key, "dead letters replayed from the console");
        format!(
            "{} replayed to {}; {} stay on {} ({} left by the filters or unreadable, {} dead-lettered again, {} failed)",
            c.replayed,
            plan.topic,
            c.left + c.again + c.failed,
            plan.subscription,
            c.left,
            c.again,
            c.failed
        )
    };
    let status = if c.failed > 0 { StatusCode::BAD_GATEWAY } else { StatusCode::OK };
    (status, render(&ReplayedPage { caller, summary, rows: done.entries.iter().map(Row::of).collect() }))
        .into_response()
}

fn confirm(caller: Caller, plan: &ReplayPlan, form: &RunForm) -> Response {
    let filter = [
        plan.reasons.first().map(|r| format!("reason {r}")),
        plan.rule.as_ref().map(|r| format!("rule {r}")),
        plan.key.as_ref().map(|k| format!("key {k}")),
    ];
    let filter: Vec<String> = filter.into_iter().flatten().collect();
    let which = if filter.is_empty() {
        "every dead letter".to_owned()
    } else {
        format!("the dead letters of {}", filter.join(", "))
    };
    let question = format!("Replay {which} on {} to {} (at most {})", plan.subscription, plan.topic, plan.max);
    let fields = [
        ("csrf", &form.csrf),
        ("mode", &form.mode),
        ("subscription", &form.subscription),
        ("topic", &form.topic),
        ("reason", &form.reason),
        ("rule", &form.rule),
        ("key", &form.key),
        ("max", &form.max),
    ];
    render(&ConfirmPage {
        caller,
        question,
        action: "replay".into(),
        fields: Hidden::given(fields),
        back: "/console/dead-letters".into(),
    })
}
