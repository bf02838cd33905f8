//! Delivering an event to an HTTP target (a rule's `forward: { url }` from the limiter, its
//! `overflow: { url }` from the dispatcher) and reading the answer: one home for the request's
//! headers, the Google ID token, and what each status means.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use drip_core::time::{DAY, Millis, format_rfc3339, wall_clock_millis};
use google_cloud_auth::credentials::idtoken::IDTokenCredentials;
use reqwest::header::HeaderValue;
use tokio::sync::Mutex;

/// When requests to targets carry a Google ID token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdTokenMode {
    /// For `*.run.app` URLs only.
    Auto,
    Always,
    Never,
}

impl std::str::FromStr for IdTokenMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(format!("DRIP_FORWARD_ID_TOKEN must be auto, always or never, got '{other}'")),
        }
    }
}

/// One event as a target receives it.
#[derive(Debug, Clone, Copy)]
pub struct EventPost<'a> {
    pub message_id: &'a str,
    pub subscription: Option<&'a str>,
    pub rule: &'a str,
    pub key: &'a str,
    pub scheduled_for: Millis,
    pub attributes: &'a BTreeMap<String, String>,
    /// The decision a shadow rule would have taken (`X-Drip-Shadow-Decision`).
    pub shadow: Option<&'a str>,
    pub data: &'a [u8],
}

/// What the target's answer means for the event (`drip_core::delivery`).
pub use drip_core::delivery::Answer;
use drip_core::partner::PartnerSays;

/// A target's answer: what it means for the event, and what it said of its limits (its
/// `RateLimit` headers and the like, `drip_core::partner`), read whatever its status.
#[derive(Debug, Clone)]
pub struct Posted {
    pub answer: Answer,
    pub partner: PartnerSays,
}

impl From<Answer> for Posted {
    fn from(answer: Answer) -> Self {
        Self { answer, partner: PartnerSays::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// A value of the event cannot be an HTTP header: no retry can help.
    #[error("{0}")]
    InvalidHeader(String),
    #[error("fetching an ID token: {0}")]
    Token(String),
}

/// A target's answer header that says what the call really cost (a count of the rule's units),
/// when only the call could know (tokens of a model API, pages of a report).
pub const COST_HEADER: &str = "x-drip-cost";

/// An HTTP client for targets: never follows redirects, times out, adds ID tokens.
#[derive(Debug)]
pub struct HttpTarget {
    http: reqwest::Client,
    id_tokens: IdTokens,
}

impl HttpTarget {
    pub fn new(timeout: Duration, mode: IdTokenMode) -> reqwest::Result<Self> {
        // Never follow redirects: reqwest would turn the POST into a bodiless GET and lose the event.
        let http = reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Self { http, id_tokens: IdTokens { mode, credentials: Mutex::default() } })
    }

    pub async fn post(&self, url: &str, event: EventPost<'_>) -> Result<Posted, PostError> {
        let content_type = if serde_json::from_slice::<serde::de::IgnoredAny>(event.data).is_ok() {
            "application/json"
        } else {
            "application/octet-stream"
        };
        let attributes = serde_json::to_string(event.attributes).unwrap_or_default();
        let mut request = self
            .http
            .post(url)
            .header("content-type", content_type)
            .header("x-drip-message-id", header_value("the message id", event.message_id)?)
            .header("x-drip-rule", header_value("the rule", event.rule)?)
            .header("x-drip-key", header_value("the key", event.key)?)
            .header("x-drip-scheduled-for", format_rfc3339(event.scheduled_for))
            .header("x-drip-attributes", header_value("the attributes", &attributes)?)
            .body(event.data.to_vec());
        if let Some(would) = event.shadow {
            request = request.header("x-drip-shadow-decision", would);
        }
        if let Some(subscription) = event.subscription {
            request = request.header("x-drip-subscription", header_value("the subscription", subscription)?);
        }
        if let Some(token) = self.id_tokens.token_for(url).await.map_err(|e| PostError::Token(e.to_string()))? {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Ok(Answer::Overloaded { status: None, detail: format!("{url}: {error}") }.into()),
        };
        let status = response.status();
        let headers = response.headers().iter().filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
        let partner = drip_core::partner::read(headers, wall_clock_millis());
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let code = status.as_u16();
        // The partner's headers were read once above: its Retry-After's end is `partner.retry_until`.
        let answer = match (code, header("retry-after"), partner.retry_until) {
            _ if status.is_success() => {
                Answer::Delivered { cost: header(COST_HEADER).and_then(|c| c.trim().parse().ok()) }
            }
            (429 | 503, Some(retry_after), Some(until)) => Answer::Wait { status: code, until, retry_after },
            (408 | 429, ..) | (500..=599, ..) => {
                Answer::Overloaded { status: Some(code), detail: format!("{url} answered {status}") }
            }
            _ if status.is_redirection() => Answer::Refused {
                detail: format!("answered {status}; Location: {}", header("location").as_deref().unwrap_or("-")),
            },
            _ => Answer::Refused { detail: format!("answered {code}") },
        };
        Ok(Posted { answer, partner })
    }
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, PostError> {
    HeaderValue::from_str(value).map_err(|_| {
        let shown: String = value.chars().take(64).collect();
        PostError::InvalidHeader(format!("{name} cannot be an HTTP header value: {shown:?}"))
    })
}

/// When a wait of `seconds` from now ends, capped at a day.
pub fn wait_seconds(seconds: u64) -> Millis {
    wall_clock_millis() + (seconds.min(DAY as u64 / 1_000) * 1_000) as Millis
}

/// Google ID tokens for targets on Cloud Run, one credential per audience.
#[derive(Debug)]
struct IdTokens {
    mode: IdTokenMode,
    credentials: Mutex<HashMap<String, IDTokenCredentials>>,
}

impl IdTokens {
    async fn token_for(&self, url: &str) -> Result<Option<String>, String> {
        let audience = url.split('/').take(3).collect::<Vec<_>>().join("/");
        let wanted = match self.mode {
            IdTokenMode::Always => true,
            IdTokenMode::Never => false,
            IdTokenMode::Auto => audience.ends_with(".run.app"),
        };
        if !wanted {
            return Ok(None);
        }
        // Built once per audience under the lock; fetching the token happens after it is released.
        let credentials = {
            let mut credentials = self.credentials.lock().await;
            if !credentials.contains_key(&audience) {
                let built = google_cloud_auth::credentials::idtoken::Builder::new(audience.clone())
                    .build()
                    .map_err(|e| e.to_string())?;
                credentials.insert(audience.clone(), built);
            }
            credentials[&audience].clone()
        };
        Ok(Some(credentials.id_token().await.map_err(|e| e.to_string())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_with_control_characters_are_refused_for_good() {
        assert!(header_value("k", "merchant_1").is_ok());
        assert!(matches!(header_value("the key", "merchant\n1"), Err(PostError::InvalidHeader(_))));
    }
}
