//! The console's actions: a form posts, the console asks to confirm (the same fields, once more,
//! with `confirm=yes`), then calls the API's own handler for it, so the action's checks, audit
//! record and answer are the API's, and shows that answer: what changed, or the API's message.

use askama::Template;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use drip_core::time::wall_clock_millis;
use drip_service::api_error::{ApiJson, ApiQuery};
use drip_store::{AuditEntry, OverrideChange, Paused, Resumed};
use serde::Deserialize;

use super::pages::key_path;
use super::{Caller, FormTokens, Refusal, cross_site, given, render};
use crate::AppState;
use crate::entities::{self, PathTarget, PauseBody, ResumeQuery, SetLimit, WhichLimit};

/// Every field any action's form has; each action reads its own.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
    #[serde(default, rename = "for")]
    length: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    limit: String,
    #[serde(default)]
    window: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    per: String,
}

/// What an action is, before it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Pause,
    Resume,
    SetLimit,
    ClearLimit,
}

impl Action {
    fn named(name: &str, budget: bool) -> Option<Self> {
        match name {
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            "set-limit" if !budget => Some(Self::SetLimit),
            "clear-limit" if !budget => Some(Self::ClearLimit),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::SetLimit => "set-limit",
            Self::ClearLimit => "clear-limit",
        }
    }

    /// `Pause merchant_7 of payouts for 15m`.
    fn describe(self, what: &str, form: &ActionForm) -> String {
        let reason = given(&form.reason).map_or(String::new(), |r| format!(" (reason: {r})"));
        let detail = match self {
            Self::Pause => format!("Pause {what} for {}", form.length.trim()),
            Self::Resume => format!("Resume {what}"),
            Self::SetLimit => {
                let window = given(&form.window).map_or(String::new(), |w| format!(" ({w})"));
                let until = given(&form.until).map_or(" with no end".to_owned(), |u| format!(" until {u}"));
                format!("Override {what}'s limit to {}{window}{until}", form.limit.trim())
            }
            Self::ClearLimit => format!("Remove {what}'s override of its limit per {}", form.per.trim()),
        };
        format!("{detail}{reason}")
    }
}

pub(super) struct Hidden {
    pub name: &'static str,
    pub value: String,
}

impl Hidden {
    /// The fields of a form that were filled in, to post again.
    pub fn given<'a>(fields: impl IntoIterator<Item = (&'static str, &'a String)>) -> Vec<Self> {
        fields.into_iter().filter(|(_, v)| !v.is_empty()).map(|(name, v)| Self { name, value: v.clone() }).collect()
    }
}

/// "Do this?": the form's fields once more, with `confirm=yes`, posted to the same URL.
#[derive(Template)]
#[template(path = "console/confirm.html")]
pub(super) struct ConfirmPage {
    pub caller: Caller,
    pub question: String,
    pub action: String,
    pub fields: Vec<Hidden>,
    pub back: String,
}

#[derive(Template)]
#[template(path = "console/result.html")]
struct ResultPage {
    caller: Caller,
    done: bool,
    message: String,
    back: String,
}

/// The checks every action passes first: an operator, from this site, with a good token.
async fn admitted(state: &AppState, caller: &Caller, headers: &HeaderMap, form: &ActionForm) -> Result<(), Refusal> {
    if !caller.may_act() {
        return Err(viewer_refused(caller));
    }
    posted_here(state, caller, headers, &form.csrf).await
}

pub(super) fn viewer_refused(caller: &Caller) -> Refusal {
    Refusal::new(StatusCode::FORBIDDEN, format!("{} may view the console, not act in it", caller.email))
}

/// A form posted from this site, with the caller's good token.
pub(super) async fn posted_here(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<(), Refusal> {
    if cross_site(headers) {
        return Err(Refusal::new(StatusCode::FORBIDDEN, "a form posted from another site is refused"));
    }
    let tokens = FormTokens::of(state).await?;
    if !tokens.check(&caller.email, csrf, wall_clock_millis() as u64) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "the form's token is missing or stale: open the page again and repeat the action",
        ));
    }
    Ok(())
}

fn confirm(caller: Caller, action: Action, what: &str, form: &ActionForm, back: String) -> Response {
    let fields = [
        ("csrf", &form.csrf),
        ("for", &form.length),
        ("reason", &form.reason),
        ("limit", &form.limit),
        ("window", &form.window),
        ("until", &form.until),
        ("per", &form.per),
    ];
    render(&ConfirmPage {
        caller,
        question: action.describe(what, form),
        action: action.name().to_owned(),
        fields: Hidden::given(fields),
        back,
    })
}

/// The API's answer as a page: what changed, or its message, with its status.
async fn shown(caller: Caller, answer: Response, back: String) -> Response {
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), 1 << 20).await.unwrap_or_default();
    let message = if status.is_success() {
        describe_answer(&body)
    } else {
        drip_core::api_error::message_of(&String::from_utf8_lossy(&body))
    };
    let page = render(&ResultPage { caller, done: status.is_success(), message, back });
    (status, page).into_response()
}

/// A change the API answered, in the words of `drip limits history`.
fn describe_answer(body: &[u8]) -> String {
    if let Ok(paused) = serde_json::from_slice::<Paused>(body) {
        return paused.change.describe();
    }
    if let Ok(resumed) = serde_json::from_slice::<Resumed>(body) {
        return resumed.change.describe();
    }
    match serde_json::from_slice::<OverrideChange>(body) {
        Ok(change) => AuditEntry::Override(change).describe(),
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

fn api_caller(caller: &Caller) -> Option<axum::Extension<drip_service::auth::Caller>> {
    Some(axum::Extension(drip_service::auth::Caller(caller.email.clone())))
}

/// `POST /console/rules/{rule}/keys/{key}/{pause|resume|set-limit|clear-limit}`.
pub async fn key_action(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((rule, key, name)): Path<(String, String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refusal) = admitted(&state, &caller, &headers, &form).await {
        return refusal.into_response();
    }
    let Some(action) = Action::named(&name, false) else {
        return Refusal::new(StatusCode::NOT_FOUND, format!("no console action '{name}' for a key")).into_response();
    };
    let back = key_path(&rule, &key);
    if form.confirm != "yes" {
        return confirm(caller, action, &format!("{key} of {rule}"), &form, back);
    }
    let Some(target) = PathTarget::named(&state, &rule, &key) else {
        return shown(caller, entities::no_such_rule(), back).await;
    };
    let (by, reason) = (api_caller(&caller), given(&form.reason));
    let answer = match action {
        Action::Pause => {
            let body = PauseBody { length: form.length.trim().to_owned(), reason };
            entities::pause_key(State(state), by, target, ApiJson(body)).await
        }
        Action::Resume => entities::resume_key(State(state), by, target, ApiQuery(ResumeQuery { reason })).await,
        Action::SetLimit => {
            let body = SetLimit {
                limit: form.limit.trim().to_owned(),
                window: given(&form.window),
                until: given(&form.until),
                forever: false,
                reason,
            };
            entities::put_limit(State(state), by, target, ApiJson(body)).await
        }
        Action::ClearLimit => {
            let which = WhichLimit { per: form.per.trim().to_owned(), window: given(&form.window), reason };
            entities::delete_limit(State(state), by, target, ApiQuery(which)).await
        }
    };
    shown(caller, answer, back).await
}

/// `POST /console/rules/{rule}/budgets/{budget}/{pause|resume}`: back to the rule's page.
pub async fn budget_action(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((rule, budget, name)): Path<(String, String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refusal) = admitted(&state, &caller, &headers, &form).await {
        return refusal.into_response();
    }
    let Some(action) = Action::named(&name, true) else {
        return Refusal::new(StatusCode::NOT_FOUND, format!("no console action '{name}' for a budget")).into_response();
    };
    let back = format!("/console/rules/{}", super::pages::encode(&rule));
    if form.confirm != "yes" {
        return confirm(caller, action, &format!("budget {budget}"), &form, back);
    }
    let Some(target) = PathTarget::named(&state, &rule, "") else {
        return shown(caller, entities::no_such_rule(), back).await;
    };
    let params = std::collections::HashMap::from([("budget".to_owned(), budget)]);
    let (by, reason) = (api_caller(&caller), given(&form.reason));
    let answer = match action {
        Action::Pause => {
            let body = PauseBody { length: form.length.trim().to_owned(), reason };
            entities::pause_budget(State(state), by, target, Path(params), ApiJson(body)).await
        }
        _ => entities::resume_budget(State(state), by, target, Path(params), ApiQuery(ResumeQuery { reason })).await,
    };
    shown(caller, answer, back).await
}
