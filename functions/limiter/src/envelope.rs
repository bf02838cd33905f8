//! The two forms a Pub/Sub push request takes: the wrapped JSON envelope, and `no_wrapper` with
//! `write_metadata` (the data as the body, metadata in `x-goog-pubsub-*` headers and attributes
//! in the other headers, which arrive lower-cased).

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use base64::Engine;
use drip_core::outcome::DlqReason;
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedMessage {
    pub id: String,
    /// The subscription that pushed it (`subscription` in the envelope,
    /// `x-goog-pubsub-subscription-name` without one).
    pub subscription: Option<String>,
    pub publish_time: Option<String>,
    pub attributes: BTreeMap<String, String>,
    pub data: Vec<u8>,
}

/// A push request nothing can be made of: dead-lettered with its reason, since retrying cannot help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub reason: DlqReason,
    pub detail: String,
    pub message_id: Option<String>,
    pub attributes: BTreeMap<String, String>,
    /// What to dead-letter: the data when known, else the whole request body.
    pub data: Vec<u8>,
}

#[derive(Deserialize)]
struct Envelope {
    message: Option<WrappedMessage>,
    #[serde(default)]
    subscription: Option<String>,
}

/// Pub/Sub sends both spellings of the id and publish time (`messageId` and `message_id`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrappedMessage {
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    attributes: Option<BTreeMap<String, String>>,
    message_id: Option<String>,
    #[serde(rename = "message_id")]
    message_id_snake: Option<String>,
    publish_time: Option<String>,
    #[serde(rename = "publish_time")]
    publish_time_snake: Option<String>,
}

/// Headers that are HTTP's or Google's own, never message attributes.
const TRANSPORT_HEADERS: &[&str] = &[
    "accept",
    "accept-encoding",
    "authorization",
    "connection",
    "content-length",
    "content-type",
    "forwarded",
    "from",
    "host",
    "traceparent",
    "tracestate",
    "transfer-encoding",
    "user-agent",
    "via",
];

pub fn parse(headers: &HeaderMap, body: &[u8]) -> Result<PushedMessage, Unusable> {
    if headers.contains_key("x-goog-pubsub-message-id") || headers.contains_key("x-goog-pubsub-subscription-name") {
        return parse_unwrapped(headers, body);
    }
    let unusable = |reason, detail: String| Unusable {
        reason,
        detail,
        message_id: None,
        attributes: BTreeMap::new(),
        data: body.to_vec(),
    };
    let envelope: Envelope = serde_json::from_slice(body)
        .map_err(|e| unusable(DlqReason::MalformedEnvelope, format!("not a push envelope: {e}")))?;
    let message =
        envelope.message.ok_or_else(|| unusable(DlqReason::MalformedEnvelope, "no message in the envelope".into()))?;
    let attributes = message.attributes.unwrap_or_default();
    let Some(id) = message.message_id.or(message.message_id_snake).filter(|id| !id.is_empty()) else {
        return Err(Unusable {
            attributes,
            ..unusable(DlqReason::MalformedEnvelope, "the message has no messageId".into())
        });
    };
    let data = match message.data {
        None => Vec::new(),
        Some(encoded) => match base64::engine::general_purpose::STANDARD.decode(encoded.as_bytes()) {
            Ok(data) => data,
            Err(e) => {
                return Err(Unusable {
                    reason: DlqReason::BadBase64,
                    detail: format!("message data is not base64: {e}"),
                    message_id: Some(id),
                    attributes,
                    data: encoded.into_bytes(),
                });
            }
        },
    };
    Ok(PushedMessage {
        id,
        subscription: envelope.subscription,
        publish_time: message.publish_time.or(message.publish_time_snake),
        attributes,
        data,
    })
}

fn parse_unwrapped(headers: &HeaderMap, body: &[u8]) -> Result<PushedMessage, Unusable> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let attributes: BTreeMap<String, String> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !TRANSPORT_HEADERS.contains(&name)
                && !name.starts_with("x-goog-")
                && !name.starts_with("x-cloud-")
                && !name.starts_with("x-forwarded-")
        })
        .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
        .collect();
    match header("x-goog-pubsub-message-id").filter(|id| !id.is_empty()) {
        Some(id) => Ok(PushedMessage {
            id,
            subscription: header("x-goog-pubsub-subscription-name"),
            publish_time: header("x-goog-pubsub-publish-time"),
            attributes,
            data: body.to_vec(),
        }),
        None => Err(Unusable {
            reason: DlqReason::MalformedEnvelope,
            detail: "no_wrapper push without x-goog-pubsub-message-id (enable write_metadata)".into(),
            message_id: None,
            attributes,
            data: body.to_vec(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn wrapped_envelopes_in_both_spellings() {
        let body = br#"{"message":{"data":"eyJhIjoxfQ==","attributes":{"event_type":"payout"},"messageId":"42","publishTime":"2026-08-03T12:00:01Z"},"subscription":"projects/p/subscriptions/s"}"#;
        let message = parse(&HeaderMap::new(), body).unwrap();
        assert_eq!(message.id, "42");
        assert_eq!(message.subscription.as_deref(), Some("projects/p/subscriptions/s"));
        assert_eq!(message.data, br#"{"a":1}"#);
        assert_eq!(message.attributes["event_type"], "payout");
        let snake = br#"{"message":{"data":"","message_id":"43","publish_time":"2026-08-03T12:00:01Z"}}"#;
        assert_eq!(parse(&HeaderMap::new(), snake).unwrap().id, "43");
        let both =
            br#"{"message":{"data":"e30=","messageId":"44","message_id":"44","publishTime":"t","publish_time":"t"}}"#;
        assert_eq!(parse(&HeaderMap::new(), both).unwrap().id, "44");
    }

    #[test]
    fn unusable_requests_say_why() {
        let reason = |body: &[u8]| parse(&HeaderMap::new(), body).unwrap_err().reason;
        assert_eq!(reason(b"not json"), DlqReason::MalformedEnvelope);
        assert_eq!(reason(br#"{"subscription":"s"}"#), DlqReason::MalformedEnvelope);
        assert_eq!(reason(br#"{"message":{"data":"e30="}}"#), DlqReason::MalformedEnvelope);
        let bad = parse(&HeaderMap::new(), br#"{"message":{"data":"%%%","messageId":"1"}}"#).unwrap_err();
        assert_eq!(
            (bad.reason, bad.message_id.as_deref(), bad.data.as_slice()),
            (DlqReason::BadBase64, Some("1"), &b"%%%"[..])
        );
    }

    #[test]
    fn unwrapped_pushes_take_metadata_and_attributes_from_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("x-goog-pubsub-message-id", HeaderValue::from_static("77"));
        headers.insert("x-goog-pubsub-subscription-name", HeaderValue::from_static("projects/p/subscriptions/s"));
        headers.insert("event_type", HeaderValue::from_static("payout"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("authorization", HeaderValue::from_static("Bearer x"));
        let message = parse(&headers, b"raw body").unwrap();
        assert_eq!(message.id, "77");
        assert_eq!(message.subscription.as_deref(), Some("projects/p/subscriptions/s"));
        assert_eq!(message.data, b"raw body");
        assert_eq!(message.attributes, BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]));
    }
}
