//! Pulling a subscription a batch at a time, with explicit acks (`drip dlq replay`): Pub/Sub's
//! REST `pull`, `acknowledge` and `modifyAckDeadline`. The official client offers only
//! streaming pull, whose lease loop suits a long-running consumer rather than a command that
//! takes what is there and stops (and whose closing stream the emulator mishandles, keeping the
//! messages it had out of reach until their deadline passes).

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::json;

use crate::access_tokens::AccessTokens;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{call}: {source}")]
    Http { call: String, source: reqwest::Error },
    #[error("{call}: {status}: {body}")]
    Refused { call: String, status: reqwest::StatusCode, body: String },
    #[error("no access token: {0}")]
    Token(String),
}

/// Ack ids in one request: Pub/Sub caps a request's size, and an ack id is a few hundred bytes,
/// so a run that leaves many dead letters gives them back a thousand at a time.
const ACK_IDS_PER_CALL: usize = 1_000;

/// One message pulled, with what acks it.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub ack_id: String,
    pub message_id: String,
    pub data: Vec<u8>,
    pub attributes: BTreeMap<String, String>,
    /// RFC 3339, as Pub/Sub gives it.
    pub publish_time: Option<String>,
}

/// One subscription, pulled over REST.
#[derive(Debug)]
pub struct Subscription {
    url: String,
    http: reqwest::Client,
    /// None on the emulator, which takes no credentials.
    tokens: Option<AccessTokens>,
}

impl Subscription {
    /// `name`: `projects/P/subscriptions/S`; `emulator`: its `host:port` or URL, else the service.
    pub fn new(name: &str, emulator: Option<&str>) -> Result<Self, PullError> {
        let (base, tokens) = match emulator {
            Some(host) => (crate::endpoint_url(host), None),
            None => {
                let tokens = AccessTokens::from_environment().map_err(|e| PullError::Token(e.to_string()))?;
                ("https://pubsub.googleapis.com".to_owned(), Some(tokens))
            }
        };
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|source| PullError::Http { call: "client".into(), source })?;
        Ok(Self { url: format!("{base}/v1/{name}"), http, tokens })
    }

    async fn call(&self, verb: &str, body: serde_json::Value) -> Result<serde_json::Value, PullError> {
        let call = format!("{}:{verb}", self.url);
        let mut request = self.http.post(&call).json(&body);
        if let Some(tokens) = &self.tokens {
            request = request.bearer_auth(tokens.token().await.map_err(PullError::Token)?);
        }
        let response = request.send().await.map_err(|source| PullError::Http { call: call.clone(), source })?;
        let status = response.status();
        let text = response.text().await.map_err(|source| PullError::Http { call: call.clone(), source })?;
        if !status.is_success() {
            return Err(PullError::Refused { call, status, body: text });
        }
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// Up to `max` of the messages there now (none: none are). `returnImmediately` is
    /// discouraged for consumers that poll; a command that stops when none are left is not one.
    pub async fn pull(&self, max: usize) -> Result<Vec<Pulled>, PullError> {
        let reply = self.call("pull", json!({ "maxMessages": max, "returnImmediately": true })).await?;
        let received = reply["receivedMessages"].as_array().cloned().unwrap_or_default();
        Ok(received
            .iter()
            .map(|r| {
                let m = &r["message"];
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                Pulled {
                    ack_id: text(&r["ackId"]),
                    message_id: text(&m["messageId"]),
                    data: base64::engine::general_purpose::STANDARD.decode(text(&m["data"])).unwrap_or_default(),
                    attributes: serde_json::from_value(m["attributes"].clone()).unwrap_or_default(),
                    publish_time: m["publishTime"].as_str().map(str::to_owned),
                }
            })
            .collect())
    }

    pub async fn acknowledge(&self, ack_ids: &[String]) -> Result<(), PullError> {
        for chunk in ack_ids.chunks(ACK_IDS_PER_CALL) {
            self.call("acknowledge", json!({ "ackIds": chunk })).await?;
        }
        Ok(())
    }

    /// Gives the messages back at once (a deadline of 0: a nack).
    pub async fn release(&self, ack_ids: &[String]) -> Result<(), PullError> {
        self.extend(ack_ids, 0).await
    }

    /// Keeps the messages out `seconds` more (held while the rest is pulled).
    pub async fn extend(&self, ack_ids: &[String], seconds: u32) -> Result<(), PullError> {
        for chunk in ack_ids.chunks(ACK_IDS_PER_CALL) {
            self.call("modifyAckDeadline", json!({ "ackIds": chunk, "ackDeadlineSeconds": seconds })).await?;
        }
        Ok(())
    }
}
