//! The operator console, served with the admin routes: server-rendered pages of the rules, their
//! busiest keys and one key's state, and forms that pause, resume and override as the API does
//! (each action calls the API's own handler, so its checks, audit record and messages are the
//! API's). No script is needed; every action is a plain form with a confirm step.
//!
//! Who is looking comes from Identity-Aware Proxy's signed header (`DRIP_IAP_AUDIENCE`), or a
//! Google ID token as the API takes one, or with `DRIP_AUTH=off` nobody in particular
//! (`DRIP_CONSOLE_ANONYMOUS`). Their role comes from `DRIP_CONSOLE_OPERATORS` (act) and
//! `DRIP_CONSOLE_VIEWERS` (look); a viewer sees no form and any action of theirs is refused.
//! Forms carry a token bound to the caller and the hour (HMAC under a secret every instance
//! shares through Redis), and a cross-site form post is refused before its token is read.

mod actions;
mod dead_letters;
mod pages;

pub use dead_letters::DeadLetterSources;

use std::sync::Arc;

use askama::Template;
use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use drip_gcp::oidc::{AuthError, IAP_ASSERTION_HEADER, OidcVerifier};
use drip_service::auth::{Auth, emails};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::AppState;

/// What a caller may do in the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Viewer,
    Operator,
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "viewer" => Ok(Self::Viewer),
            "operator" => Ok(Self::Operator),
            other => Err(format!("'{other}' is not a console role (viewer or operator)")),
        }
    }
}

/// How the console knows its callers: built from the settings at start-up.
#[derive(Debug, Clone)]
pub struct ConsoleAuth {
    auth: Auth,
    iap: Option<Arc<OidcVerifier>>,
    operators: Arc<Vec<String>>,
    viewers: Arc<Vec<String>>,
    /// The role of a caller no token names, with authentication off (`DRIP_AUTH=off`).
    anonymous: Option<Role>,
    /// The secret form tokens are signed with, read from the store once.
    secret: Arc<tokio::sync::OnceCell<Vec<u8>>>,
}

impl ConsoleAuth {
    pub fn new(
        auth: Auth,
        iap: Option<Arc<OidcVerifier>>,
        (operators, viewers): (&str, &str),
        anonymous: Option<Role>,
    ) -> Self {
        Self {
            auth,
            iap,
            operators: Arc::new(emails(operators)),
            viewers: Arc::new(emails(viewers)),
            anonymous,
            secret: Arc::default(),
        }
    }

    /// Authentication off, every caller in `role` (tests of handlers in process).
    pub fn anonymous(role: Role) -> Self {
        Self::new(Auth::Off, None, ("", ""), Some(role))
    }

    async fn identify(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let email = match (&self.iap, text(IAP_ASSERTION_HEADER), &self.auth) {
            (Some(iap), Some(assertion), _) => iap.verify_token(assertion).await,
            (Some(_), None, Auth::Oidc(_)) => Err(AuthError::Unauthenticated(
                "no IAP assertion: open the console through Identity-Aware Proxy".into(),
            )),
            (_, _, Auth::Oidc(verifier)) => verifier.verify(text(header::AUTHORIZATION.as_str())).await,
            (_, _, Auth::Off) => {
                return match self.anonymous {
                    Some(role) => Ok(Caller { email: "anonymous".into(), role }),
                    None => Err(Refusal::new(
                        StatusCode::FORBIDDEN,
                        "DRIP_CONSOLE_ANONYMOUS is none: nobody may open the console without authentication",
                    )),
                };
            }
        };
        let email = email.map_err(|error| {
            tracing::warn!(%error, "refused a console caller");
            match error {
                AuthError::Unauthenticated(_) => Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated: sign in through the console's Identity-Aware Proxy",
                ),
                AuthError::Forbidden(why) => Refusal::new(StatusCode::FORBIDDEN, why),
            }
        })?;
        let role = if self.operators.contains(&email) {
            Role::Operator
        } else if self.viewers.contains(&email) {
            Role::Viewer
        } else {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                format!("{email} is in neither DRIP_CONSOLE_OPERATORS nor DRIP_CONSOLE_VIEWERS"),
            ));
        };
        Ok(Caller { email, role })
    }
}

/// The person using the console, and what they may do.
#[derive(Debug, Clone)]
pub struct Caller {
    pub email: String,
    pub role: Role,
}

impl Caller {
    pub fn may_act(&self) -> bool {
        self.role == Role::Operator
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        state.auth.console.identify(&parts.headers).await.map_err(IntoResponse::into_response)
    }
}

/// A page that says why the console refused, with the status the API would answer.
#[derive(Debug)]
pub struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

#[derive(Template)]
#[template(path = "console/refused.html")]
struct RefusedPage<'a> {
    title: &'a str,
    status: u16,
    message: &'a str,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Refused");
        let page = RefusedPage { title, status: self.status.as_u16(), message: &self.message };
        (self.status, render(&page)).into_response()
    }
}

/// A template as HTML; a template that fails to render is a 500 naming it.
fn render<T: Template>(page: &T) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(error) => {
            tracing::error!(%error, "a console page failed to render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page failed to render").into_response()
        }
    }
}

/// A form field as given, or none when left empty.
fn given(text: &str) -> Option<String> {
    Some(text.trim()).filter(|t| !t.is_empty()).map(str::to_owned)
}

/// How long a form's token stays good, in hours.
const TOKEN_HOURS: u64 = 12;
const HOUR_MS: u64 = 3_600_000;

/// Form tokens: `<hour>.<HMAC-SHA256(secret, email|hour)>`, good for [`TOKEN_HOURS`].
pub(crate) struct FormTokens<'a> {
    secret: &'a [u8],
}

impl<'a> FormTokens<'a> {
    async fn of(state: &'a AppState) -> Result<Self, Refusal> {
        let store = &state.store;
        let secret = state.auth.console.secret.get_or_try_init(|| store.shared_secret("console-forms")).await;
        match secret {
            Ok(secret) => Ok(Self { secret }),
            Err(error) => {
                tracing::warn!(%error, "reading the console's form secret failed");
                Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "redis unavailable"))
            }
        }
    }

    fn mac(&self, email: &str, hour: u64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.secret).expect("HMAC takes a key of any length");
        mac.update(format!("{email}|{hour}").as_bytes());
        mac
    }

    fn issue(&self, email: &str, now: u64) -> String {
        let hour = now / HOUR_MS;
        format!("{hour}.{}", hex::encode(self.mac(email, hour).finalize().into_bytes()))
    }

    fn check(&self, email: &str, token: &str, now: u64) -> bool {
        let Some((hour, mac)) = token.split_once('.') else { return false };
        let (Ok(hour), Ok(mac)) = (hour.parse::<u64>(), hex::decode(mac)) else { return false };
        let current = now / HOUR_MS;
        hour <= current && current - hour < TOKEN_HOURS && self.mac(email, hour).verify_slice(&mac).is_ok()
    }
}

/// A form post from another site (by the browser's `Sec-Fetch-Site`, or an `Origin` that is not
/// this host) is refused whatever it carries.
fn cross_site(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if headers.get("sec-fetch-site").is_some_and(|site| site == "cross-site") {
        return true;
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, rest)| rest) != Some(host),
        _ => false,
    }
}

/// The console's routes; served where the admin routes are.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(pages::overview))
        .route("/console/rules/{rule}", get(pages::rule))
        .route("/console/rules/{rule}/keys/{key}", get(pages::key))
        .route("/console/rules/{rule}/keys/{key}/{action}", post(actions::key_action))
        .route("/console/rules/{rule}/budgets/{budget}/{action}", post(actions::budget_action))
        .route("/console/dead-letters", get(dead_letters::page).post(dead_letters::run))
        .route("/console/static/console.css", get(stylesheet))
}

async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css")], include_str!("../../templates/console/console.css")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_token_is_bound_to_its_caller_and_ends() {
        let tokens = FormTokens { secret: b"shared" };
        let now = 100 * HOUR_MS + 5;
        let token = tokens.issue("ops@example.com", now);
        assert!(tokens.check("ops@example.com", &token, now));
        assert!(tokens.check("ops@example.com", &token, now + (TOKEN_HOURS - 1) * HOUR_MS));
        assert!(!tokens.check("ops@example.com", &token, now + TOKEN_HOURS * HOUR_MS), "too old");
        assert!(!tokens.check("viewer@example.com", &token, now), "another caller's");
        assert!(!FormTokens { secret: b"other" }.check("ops@example.com", &token, now), "another secret's");
        assert!(!tokens.check("ops@example.com", "100.00", now));
        assert!(!tokens.check("ops@example.com", "", now));
    }

    #[test]
    fn a_post_from_another_site_is_cross_site() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            pairs.iter().map(|(n, v)| (header::HeaderName::from_static(n), v.parse().unwrap())).collect::<HeaderMap>()
        };
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&headers(&[("origin", "https://evil.example"), ("host", "drip.example")])));
        assert!(!cross_site(&headers(&[("origin", "https://drip.example"), ("host", "drip.example")])));
        assert!(!cross_site(&headers(&[("sec-fetch-site", "same-origin"), ("host", "drip.example")])));
    }
}
