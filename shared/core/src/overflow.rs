//! The body of the Cloud Task that carries a delayed event to the dispatcher (the seed's format,
//! plus what the dispatcher needs to republish it faithfully and consumers need to deduplicate).

use std::collections::BTreeMap;

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// What the limiter hands the dispatcher through a Cloud Task. On the wire (the seed's format) the
/// payload is one of three fields; here it is one [`TaskPayload`], so a body with two of them never
/// gets past deserialization.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "OwnedWireTaskBody")]
pub struct TaskBody {
    pub is_ratelimited: bool,
    pub rate_limit_meta: RateLimitMeta,
    pub payload: TaskPayload,
    pub attributes: BTreeMap<String, String>,
    /// The id Pub/Sub gave the message (unique within its topic only).
    pub message_id: String,
    /// The subscription it came through: with `message_id`, the message's identity.
    pub subscription: Option<String>,
    pub publish_time: Option<String>,
}

/// Where a task's data is.
#[derive(Debug, Clone)]
pub enum TaskPayload {
    /// The data as it came, when it is JSON: `originalPayload`, verbatim.
    Json(Box<RawValue>),
    /// Any other data: `originalPayloadBase64`.
    Bytes(Vec<u8>),
    /// The data waits in Redis under this reference (too large for a task): `claimCheck`.
    ClaimCheck(String),
}

impl TaskPayload {
    /// `data` inline: verbatim when it is JSON, else as bytes (base64 on the wire).
    pub fn inline(data: &[u8]) -> Self {
        let verbatim_json = std::str::from_utf8(data)
            .ok()
            .filter(|text| text.trim() == *text)
            .and_then(|text| RawValue::from_string(text.to_owned()).ok());
        verbatim_json.map_or_else(|| Self::Bytes(data.to_vec()), Self::Json)
    }

    /// The data, unless it waits behind a claim-check.
    pub fn data(&self) -> Option<Vec<u8>> {
        match self {
            Self::Json(json) => Some(json.get().as_bytes().to_vec()),
            Self::Bytes(bytes) => Some(bytes.clone()),
            Self::ClaimCheck(_) => None,
        }
    }
}

/// The task body as JSON has it: the payload is whichever of the three fields is present.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTaskBody<J, S, M, A> {
    is_ratelimited: bool,
    rate_limit_meta: M,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    original_payload: Option<J>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    original_payload_base64: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim_check: Option<S>,
    attributes: A,
    message_id: S,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subscription: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    publish_time: Option<S>,
}

type OwnedWireTaskBody = WireTaskBody<Box<RawValue>, String, RateLimitMeta, BTreeMap<String, String>>;

impl TryFrom<OwnedWireTaskBody> for TaskBody {
    type Error = String;

    fn try_from(wire: OwnedWireTaskBody) -> Result<Self, String> {
        use base64::Engine;
        let payload = match (wire.original_payload, wire.original_payload_base64, wire.claim_check) {
            (Some(json), None, None) => TaskPayload::Json(json),
            (None, Some(encoded), None) => TaskPayload::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| format!("originalPayloadBase64: {e}"))?,
            ),
            (None, None, Some(reference)) => TaskPayload::ClaimCheck(reference),
            (None, None, None) => TaskPayload::Bytes(Vec::new()),
            _ => return Err("more than one of originalPayload, originalPayloadBase64 and claimCheck".into()),
        };
        Ok(Self {
            is_ratelimited: wire.is_ratelimited,
            rate_limit_meta: wire.rate_limit_meta,
            payload,
            attributes: wire.attributes,
            message_id: wire.message_id,
            subscription: wire.subscription,
            publish_time: wire.publish_time,
        })
    }
}

impl Serialize for TaskBody {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        let base64;
        let (json, encoded, claim_check) = match &self.payload {
            TaskPayload::Json(json) => (Some(json.as_ref()), None, None),
            TaskPayload::Bytes(bytes) => {
                base64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                (None, Some(base64.as_str()), None)
            }
            TaskPayload::ClaimCheck(reference) => (None, None, Some(reference.as_str())),
        };
        WireTaskBody {
            is_ratelimited: self.is_ratelimited,
            rate_limit_meta: &self.rate_limit_meta,
            original_payload: json,
            original_payload_base64: encoded,
            claim_check,
            attributes: &self.attributes,
            message_id: self.message_id.as_str(),
            subscription: self.subscription.as_deref(),
            publish_time: self.publish_time.as_deref(),
        }
        .serialize(serializer)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitMeta {
    pub key: String,
    pub rule: String,
    /// The rule's `id`, when it is not its name: what the task's Redis keys hang on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<String>,
    /// `RPS`, `RPM`, `RPD`... of the rule's first limit.
    pub window_type: String,
    pub limit: u64,
    pub scheduled_for: String,
    pub overflow_topic: String,
    /// The event's cost, for a new slot the dispatcher reserves (an `overflow: { url }` that
    /// answered 429); absent in tasks made before it existed (cost 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

/// The task's name within its queue, derived from (rule, message identity) so a retried create for
/// a redelivered message is refused as ALREADY_EXISTS instead of scheduling the event twice, while
/// one id from two subscriptions makes two tasks. A task the dispatcher makes for a new slot adds
/// the slot, so that each new slot has its own task and a retried creation its own name again.
pub fn task_id(rule: &str, identity: &str, reslotted_for: Option<i64>) -> String {
    let digest = Sha256::digest(format!("{rule}\0{identity}").as_bytes());
    match reslotted_for {
        None => format!("{}-{rule}", hex::encode(&digest[..16])),
        Some(slot) => format!("{}-{rule}-at-{slot}", hex::encode(&digest[..16])),
    }
}

/// A key's tasks always go to the same queue.
pub fn queue_index(rule: &str, key: &str, queues: usize) -> usize {
    let digest = Sha256::digest(format!("{rule}|{key}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % queues.max(1) as u64) as usize
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

impl RateLimitMeta {
    /// The rule's id (its name unless the rule sets one).
    pub fn rule_id(&self) -> &str {
        self.rule_id.as_deref().unwrap_or(&self.rule)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_are_stable_valid_and_distinct() {
        let id = task_id("payouts", "1234@aaaaaaaaaaaa", None);
        assert_eq!(id, task_id("payouts", "1234@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("payouts", "1234@bbbbbbbbbbbb", None));
        assert_ne!(id, task_id("payouts", "1235@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("kyc", "1234@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("payouts", "1234@aaaaaaaaaaaa", Some(1_785_758_400_000)));
        for id in [id, task_id("payouts", "1234@aaaaaaaaaaaa", Some(1_785_758_400_000))] {
            assert!(id.len() <= 500 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        }
    }

    #[test]
    fn a_key_always_maps_to_one_queue_and_keys_spread() {
        assert_eq!(queue_index("r", "k", 4), queue_index("r", "k", 4));
        let used: std::collections::HashSet<usize> = (0..64).map(|i| queue_index("r", &format!("k{i}"), 4)).collect();
        assert_eq!(used.len(), 4);
    }

    fn body() -> TaskBody {
        TaskBody {
            is_ratelimited: true,
            rate_limit_meta: RateLimitMeta {
                key: "merchant_8421:payout".into(),
                rule: "payouts".into(),
                rule_id: None,
                window_type: "RPM".into(),
                limit: 100,
                scheduled_for: "2026-08-03T14:02:00.000Z".into(),
                overflow_topic: "payout-events-overflow".into(),
                cost: None,
            },
            payload: TaskPayload::Bytes(Vec::new()),
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
        let json = serde_json::to_string(&TaskBody { payload: TaskPayload::inline(data), ..body() }).unwrap();
        assert!(json.starts_with(r#"{"isRatelimited":true,"rateLimitMeta":{"key":"merchant_8421:payout""#), "{json}");
        assert!(
            json.contains(r#""originalPayload":{"payoutId": "pay_902184", "amount": 2500.00, "currency": "INR"}"#),
            "{json}"
        );
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert!(matches!(back.payload, TaskPayload::Json(_)));
        assert_eq!(back.payload.data().unwrap(), data);
    }

    #[test]
    fn other_data_travels_in_base64() {
        let data = b"\x00\xffnot json";
        let json = serde_json::to_string(&TaskBody { payload: TaskPayload::inline(data), ..body() }).unwrap();
        assert!(json.contains(r#""originalPayloadBase64":"AP9ub3QganNvbg==""#), "{json}");
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert_eq!(back.payload.data().unwrap(), data);
    }

    #[test]
    fn a_claim_check_travels_as_a_reference_and_has_no_inline_data() {
        let reference = "drip:{payouts|m1}:p:abc";
        let json =
            serde_json::to_string(&TaskBody { payload: TaskPayload::ClaimCheck(reference.into()), ..body() }).unwrap();
        assert!(
            json.contains(r#""claimCheck":"drip:{payouts|m1}:p:abc""#) && !json.contains("originalPayload"),
            "{json}"
        );
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert!(matches!(&back.payload, TaskPayload::ClaimCheck(r) if r == reference));
        assert_eq!(back.payload.data(), None);
    }

    #[test]
    fn a_body_with_two_payloads_or_bad_base64_does_not_deserialize() {
        let json = serde_json::to_string(&body()).unwrap();
        let two = json.replacen('{', r#"{"claimCheck":"x","#, 1);
        let error = serde_json::from_str::<TaskBody>(&two).unwrap_err().to_string();
        assert!(error.contains("more than one of"), "{error}");
        let bad = json.replace(r#""originalPayloadBase64":"""#, r#""originalPayloadBase64":"!!""#);
        assert_ne!(bad, json);
        let error = serde_json::from_str::<TaskBody>(&bad).unwrap_err().to_string();
        assert!(error.contains("originalPayloadBase64"), "{error}");
    }
}
