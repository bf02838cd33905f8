//! The body of the Cloud Task that carries a delayed event to the dispatcher (the seed's format,
//! plus what the dispatcher needs to republish it faithfully and consumers need to deduplicate).

use std::collections::BTreeMap;

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Sha256;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskBody {
    pub is_ratelimited: bool,
    pub rate_limit_meta: RateLimitMeta,
    /// The message data as it came, when it is JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_payload: Option<Box<RawValue>>,
    /// The message data in base64, when it is not JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_payload_base64: Option<String>,
    /// Where the data waits in Redis when it was too large for a task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_check: Option<String>,
    pub attributes: BTreeMap<String, String>,
    /// The id Pub/Sub gave the message (unique within its topic only).
    pub message_id: String,
    /// The subscription it came through: with `message_id`, the message's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_time: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitMeta {
    pub key: String,
    pub rule: String,
    /// `RPS`, `RPM`, `RPD`... of the rule's first limit.
    pub window_type: String,
    pub limit: u64,
    pub scheduled_for: String,
    pub overflow_topic: String,
}

/// Where a task's payload is.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    Inline(Vec<u8>),
    ClaimCheck(&'a str),
}

/// The header that carries a task body's signature: `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE_HEADER: &str = "x-drip-signature";

/// Signs and checks task bodies with a key only the limiter and the dispatcher hold, so the
/// dispatcher knows a task is the limiter's (and may then dead-letter it when its overflow topic is
/// retired) without becoming an open relay for whoever can create tasks.
#[derive(Clone)]
pub struct TaskSigner {
    key: Vec<u8>,
}

impl fmt::Debug for TaskSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TaskSigner(..)")
    }
}

impl TaskSigner {
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Self { key: key.as_ref().to_vec() }
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(body);
        mac
    }

    /// The value of [`SIGNATURE_HEADER`] for `body`.
    pub fn sign(&self, body: &[u8]) -> String {
        let tag = self.mac(body).finalize().into_bytes();
        format!("sha256={}", hex::encode(tag))
    }

    /// Whether `signature` is this key's for `body` (compared in constant time).
    pub fn verify(&self, body: &[u8], signature: &str) -> bool {
        let tag = signature.strip_prefix("sha256=").and_then(|tag| hex::decode(tag).ok());
        tag.is_some_and(|tag| self.mac(body).verify_slice(&tag).is_ok())
    }
}

impl TaskBody {
    /// The body with `data` inline: verbatim when it is JSON, else in base64.
    pub fn with_data(mut self, data: &[u8]) -> Self {
        use base64::Engine;
        let verbatim_json = std::str::from_utf8(data)
            .ok()
            .filter(|text| text.trim() == *text)
            .and_then(|text| RawValue::from_string(text.to_owned()).ok());
        match verbatim_json {
            Some(json) => self.original_payload = Some(json),
            None => self.original_payload_base64 = Some(base64::engine::general_purpose::STANDARD.encode(data)),
        }
        self
    }

    pub fn payload(&self) -> Result<Payload<'_>, String> {
        use base64::Engine;
        match (&self.original_payload, &self.original_payload_base64, &self.claim_check) {
            (Some(json), None, None) => Ok(Payload::Inline(json.get().as_bytes().to_vec())),
            (None, Some(encoded), None) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map(Payload::Inline)
                .map_err(|e| format!("originalPayloadBase64: {e}")),
            (None, None, Some(reference)) => Ok(Payload::ClaimCheck(reference)),
            (None, None, None) => Ok(Payload::Inline(Vec::new())),
            _ => Err("more than one of originalPayload, originalPayloadBase64 and claimCheck".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> TaskBody {
        TaskBody {
            is_ratelimited: true,
            rate_limit_meta: RateLimitMeta {
                key: "merchant_8421:payout".into(),
                rule: "payouts".into(),
                window_type: "RPM".into(),
                limit: 100,
                scheduled_for: "2026-08-03T14:02:00.000Z".into(),
                overflow_topic: "payout-events-overflow".into(),
            },
            original_payload: None,
            original_payload_base64: None,
            claim_check: None,
            attributes: BTreeMap::from([("event_type".into(), "payout".into())]),
            message_id: "m1".into(),
            subscription: None,
            publish_time: None,
        }
    }

    #[test]
    fn signatures_hold_only_for_the_same_key_and_body() {
        let signer = TaskSigner::new("k1");
        let signature = signer.sign(b"body");
        assert!(signature.starts_with("sha256=") && signature.len() == 7 + 64);
        assert!(signer.verify(b"body", &signature));
        assert!(!signer.verify(b"body!", &signature));
        assert!(!TaskSigner::new("k2").verify(b"body", &signature));
        assert!(!signer.verify(b"body", "sha256=zz"));
        assert!(!signer.verify(b"body", ""));
    }

    #[test]
    fn json_data_travels_verbatim_in_the_seed_format() {
        let data = br#"{"payoutId": "pay_902184", "amount": 2500.00, "currency": "INR"}"#;
        let json = serde_json::to_string(&body().with_data(data)).unwrap();
        assert!(json.starts_with(r#"{"isRatelimited":true,"rateLimitMeta":{"key":"merchant_8421:payout""#), "{json}");
        assert!(
            json.contains(r#""originalPayload":{"payoutId": "pay_902184", "amount": 2500.00, "currency": "INR"}"#),
            "{json}"
        );
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert_eq!(back.payload().unwrap(), Payload::Inline(data.to_vec()));
    }

    #[test]
    fn other_data_travels_in_base64() {
        let data = b"\x00\xffnot json";
        let back: TaskBody = serde_json::from_str(&serde_json::to_string(&body().with_data(data)).unwrap()).unwrap();
        assert!(back.original_payload.is_none());
        assert_eq!(back.payload().unwrap(), Payload::Inline(data.to_vec()));
    }
}
