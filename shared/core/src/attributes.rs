//! The attribute contract: the `drip-*` attributes Drip stamps on what it publishes (a forward, an
//! overflow message, a dead letter), and Pub/Sub's limits they count against. Nothing else builds
//! these names or checks these limits.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;

use crate::outcome::DlqReason;
use crate::time::{Millis, format_rfc3339};

/// The message's id as Pub/Sub gave it (unique within its topic only).
pub const MESSAGE_ID: &str = "drip-message-id";
/// The subscription it came through: with the id, the message's identity.
pub const SUBSCRIPTION: &str = "drip-subscription";
pub const RULE: &str = "drip-rule";
pub const KEY: &str = "drip-key";
pub const SCHEDULED_FOR: &str = "drip-scheduled-for";
/// When the event was published (the time its answer is filed under): with `drip-message-id` and
/// `drip-subscription`, what `POST /v1/feedback` needs to correct its cost after the call.
pub const PUBLISHED: &str = "drip-published";
pub const REASON: &str = "drip-reason";
pub const DETAIL: &str = "drip-detail";
/// On a forward of a `mode: shadow` rule: what enforcing would have done (`forward`, `delay`, or
/// `dlq:<reason>`); `drip-scheduled-for` is then the slot it would have had.
pub const SHADOW_DECISION: &str = "drip-shadow-decision";
/// On a dead letter of the dispatcher: the task's name.
pub const TASK: &str = "drip-task";
/// On a dead letter whose original attributes did not fit beside Drip's: the body is a JSON
/// envelope `{"attributes": {...}, "data": "<base64>"}`.
pub const WRAPPED: &str = "drip-wrapped";
/// The seed's marker on overflow messages.
pub const IS_RATELIMITED: &str = "isRatelimited";
/// On an event replayed from a dead-letter topic (`drip dlq replay`): the identity of the message
/// it was. The limiter reserves a replayed event under it (with [`REPLAY_PUBLISHED`] as its
/// publish time), so replaying one dead letter twice acts once.
pub const REPLAY_OF: &str = "drip-replay-of";
/// On a replayed event: when its dead letter was published (RFC 3339), the same on every replay.
pub const REPLAY_PUBLISHED: &str = "drip-replay-published";
/// Every attribute Drip stamps starts so (the seed's `isRatelimited` aside).
pub const PREFIX: &str = "drip-";

/// Pub/Sub's resource limits (https://cloud.google.com/pubsub/quotas#resource_limits).
pub const MAX_ATTRIBUTES: usize = 100;
pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_VALUE_BYTES: usize = 1024;
pub const MAX_MESSAGE_BYTES: usize = 10 * 1000 * 1000;

/// What Drip says about one event on whatever it publishes.
#[derive(Debug, Clone, Default)]
pub struct Stamp<'a> {
    pub message_id: Option<&'a str>,
    pub subscription: Option<&'a str>,
    pub rule: Option<&'a str>,
    pub key: Option<&'a str>,
    pub scheduled_for: Option<Millis>,
    pub published: Option<Millis>,
    /// Overflow messages carry the seed's `isRatelimited: true`.
    pub ratelimited: bool,
    /// Dead letters: why, and the detail.
    pub reason: Option<(DlqReason, &'a str)>,
    pub task: Option<&'a str>,
    pub shadow_decision: Option<&'a str>,
}

/// A message Pub/Sub would refuse; no retry can change that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Refused {
    pub reason: DlqReason,
    pub detail: String,
}

impl Stamp<'_> {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(10);
        let mut add = |name: &'static str, value: Option<String>| {
            if let Some(value) = value {
                pairs.push((name, truncate(&value, MAX_VALUE_BYTES)));
            }
        };
        add(MESSAGE_ID, self.message_id.map(str::to_owned));
        add(SUBSCRIPTION, self.subscription.map(str::to_owned));
        add(RULE, self.rule.map(str::to_owned));
        add(KEY, self.key.map(str::to_owned));
        add(SCHEDULED_FOR, self.scheduled_for.map(format_rfc3339));
        add(PUBLISHED, self.published.map(format_rfc3339));
        add(IS_RATELIMITED, self.ratelimited.then(|| "true".to_owned()));
        add(REASON, self.reason.map(|(reason, _)| reason.as_str().to_owned()));
        add(DETAIL, self.reason.map(|(_, detail)| detail.to_owned()));
        add(TASK, self.task.map(str::to_owned));
        add(SHADOW_DECISION, self.shadow_decision.map(str::to_owned));
        pairs
    }

    /// The original attributes with Drip's stamped over them, or why Pub/Sub would refuse the message.
    pub fn apply(
        &self,
        original: &BTreeMap<String, String>,
        data_len: usize,
    ) -> Result<BTreeMap<String, String>, Refused> {
        let mut attributes = original.clone();
        attributes.extend(self.pairs().into_iter().map(|(name, value)| (name.to_owned(), value)));
        check(&attributes, data_len)?;
        Ok(attributes)
    }

    /// A dead letter that Pub/Sub accepts whatever the event was: the data and attributes as they
    /// came when they fit beside Drip's; else the original attributes move into a JSON envelope
    /// (`drip-wrapped: json`); else (data near 10 MB) the data with Drip's attributes alone (the
    /// dropped names in the detail), or at Pub/Sub's very limit with `drip-reason` and
    /// `drip-message-id` only.
    pub fn dead_letter(&self, original: &BTreeMap<String, String>, data: &[u8]) -> (Vec<u8>, BTreeMap<String, String>) {
        if let Ok(attributes) = self.apply(original, data.len()) {
            return (data.to_vec(), attributes);
        }
        let own: BTreeMap<String, String> = self.pairs().into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
        #[derive(Serialize)]
        struct Wrapped<'a> {
            attributes: &'a BTreeMap<String, String>,
            data: String,
        }
        let data_b64 = base64::engine::general_purpose::STANDARD.encode(data);
        let wrapped = serde_json::to_vec(&Wrapped { attributes: original, data: data_b64 }).unwrap_or_default();
        let mut attributes = own.clone();
        attributes.insert(WRAPPED.to_owned(), "json".to_owned());
        if check(&attributes, wrapped.len()).is_ok() {
            return (wrapped, attributes);
        }
        let names: Vec<&str> = original.keys().map(String::as_str).collect();
        let mut attributes = own;
        let detail = attributes.get(DETAIL).cloned().unwrap_or_default();
        let dropped = format!("{detail}; attributes dropped (message too large to carry them): {}", names.join(","));
        attributes.insert(DETAIL.to_owned(), truncate(&dropped, MAX_VALUE_BYTES));
        if check(&attributes, data.len()).is_err() {
            // Data at Pub/Sub's very limit: keep only what says why and which message it was.
            attributes.retain(|name, _| name == REASON || name == MESSAGE_ID);
        }
        (data.to_vec(), attributes)
    }
}

/// What a dead letter says of the event it holds, and the event as it came (the inverse of
/// [`Stamp::dead_letter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterView {
    /// The event's own attributes, without Drip's (unwrapped from a `drip-wrapped: json` body).
    pub attributes: BTreeMap<String, String>,
    pub data: Vec<u8>,
    pub reason: Option<String>,
    pub rule: Option<String>,
    pub key: Option<String>,
    /// `drip-message-id` and `drip-subscription`: which message the event was.
    pub message_id: Option<String>,
    pub subscription: Option<String>,
    /// The attributes were dropped (the data was too large to carry them), as `drip-detail` says.
    pub attributes_dropped: bool,
    /// `drip-detail`: what the reason's code does not say.
    pub detail: Option<String>,
    /// The event was itself a replay (`drip-replay-of`): the identity of the message it replayed.
    pub replay_of: Option<String>,
}

impl DeadLetterView {
    pub fn of(attributes: &BTreeMap<String, String>, data: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Wrapped {
            attributes: BTreeMap<String, String>,
            data: String,
        }
        let get = |name: &str| attributes.get(name).cloned();
        let unwrapped = (attributes.get(WRAPPED).map(String::as_str) == Some("json"))
            .then(|| serde_json::from_slice::<Wrapped>(data).ok())
            .flatten()
            .and_then(|w| Some((w.attributes, base64::engine::general_purpose::STANDARD.decode(w.data).ok()?)));
        let replay_of =
            unwrapped.as_ref().and_then(|(own, _)| own.get(REPLAY_OF)).or(attributes.get(REPLAY_OF)).cloned();
        let (own, data) = match unwrapped {
            Some((own, data)) => (own, data),
            None => {
                let own = attributes.iter().filter(|(name, _)| !name.starts_with(PREFIX));
                (own.map(|(n, v)| (n.clone(), v.clone())).collect(), data.to_vec())
            }
        };
        Self {
            attributes: own,
            data,
            reason: get(REASON),
            rule: get(RULE),
            key: get(KEY),
            message_id: get(MESSAGE_ID),
            subscription: get(SUBSCRIPTION),
            attributes_dropped: attributes.get(DETAIL).is_some_and(|d| d.contains("attributes dropped")),
            detail: get(DETAIL),
            replay_of,
        }
    }
}

/// Pub/Sub's limits on one message.
pub fn check(attributes: &BTreeMap<String, String>, data_len: usize) -> Result<(), Refused> {
    let refuse = |reason, detail: String| Err(Refused { reason, detail });
    if attributes.len() > MAX_ATTRIBUTES {
        let detail = format!("{} attributes with Drip's own; Pub/Sub takes {MAX_ATTRIBUTES}", attributes.len());
        return refuse(DlqReason::AttributesOverLimit, detail);
    }
    if let Some(name) = attributes.keys().find(|name| name.len() > MAX_NAME_BYTES) {
        let detail =
            format!("attribute name of {} bytes (Pub/Sub takes {MAX_NAME_BYTES}): {}", name.len(), truncate(name, 64));
        return refuse(DlqReason::AttributesOverLimit, detail);
    }
    if let Some((name, value)) = attributes.iter().find(|(_, value)| value.len() > MAX_VALUE_BYTES) {
        let detail =
            format!("attribute {} of {} bytes (Pub/Sub takes {MAX_VALUE_BYTES})", truncate(name, 64), value.len());
        return refuse(DlqReason::AttributesOverLimit, detail);
    }
    let size = data_len + attributes.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
    if size > MAX_MESSAGE_BYTES {
        let detail = format!("{size} bytes with Drip's attributes; Pub/Sub takes {MAX_MESSAGE_BYTES}");
        return refuse(DlqReason::MessageTooLarge, detail);
    }
    Ok(())
}

/// At most `max` bytes, cut on a character boundary.
pub fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(n: usize) -> BTreeMap<String, String> {
        (0..n).map(|i| (format!("a{i}"), "v".to_owned())).collect()
    }

    fn stamp() -> Stamp<'static> {
        Stamp { message_id: Some("m1"), subscription: Some("s"), rule: Some("r"), key: Some("k"), ..Stamp::default() }
    }

    #[test]
    fn drip_attributes_count_against_pubsubs_limits() {
        let stamped = stamp().apply(&attributes(96), 10).unwrap();
        assert_eq!((stamped.len(), stamped[MESSAGE_ID].as_str(), stamped[SUBSCRIPTION].as_str()), (100, "m1", "s"));
        let refused = stamp().apply(&attributes(97), 10).unwrap_err();
        assert_eq!(refused.reason, DlqReason::AttributesOverLimit);
        assert!(refused.detail.contains("101 attributes"), "{}", refused.detail);
        let long_name = BTreeMap::from([("n".repeat(257), "v".to_owned())]);
        assert_eq!(stamp().apply(&long_name, 0).unwrap_err().reason, DlqReason::AttributesOverLimit);
        let long_value = BTreeMap::from([("n".to_owned(), "v".repeat(1025))]);
        assert_eq!(stamp().apply(&long_value, 0).unwrap_err().reason, DlqReason::AttributesOverLimit);
        assert_eq!(stamp().apply(&attributes(1), MAX_MESSAGE_BYTES).unwrap_err().reason, DlqReason::MessageTooLarge);
    }

    #[test]
    fn drip_values_are_cut_to_pubsubs_limit_on_a_character_boundary() {
        let key = "é".repeat(600);
        let stamped = Stamp { key: Some(&key), ..stamp() }.apply(&BTreeMap::new(), 0).unwrap();
        assert_eq!(stamped[KEY].len(), 1024);
        assert!(key.starts_with(&stamped[KEY]));
    }

    #[test]
    fn a_dead_letter_gives_back_the_event_it_holds() {
        let with_reason = Stamp { reason: Some((DlqReason::MaxDelayExceeded, "late")), ..stamp() };
        let original = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
        let (data, stamped) = with_reason.dead_letter(&original, b"{\"n\":1}");
        let view = DeadLetterView::of(&stamped, &data);
        assert_eq!((view.attributes, view.data.as_slice()), (original, &b"{\"n\":1}"[..]));
        assert_eq!(view.reason.as_deref(), Some("max_delay_exceeded"));
        assert_eq!(
            (view.rule.as_deref(), view.key.as_deref(), view.message_id.as_deref()),
            (Some("r"), Some("k"), Some("m1"))
        );
        // Too many attributes to carry beside Drip's: wrapped in a JSON envelope, unwrapped again.
        let crowded = attributes(99);
        let (data, attributes) = with_reason.dead_letter(&crowded, &[0, 159, 146, 150]);
        assert_eq!(attributes[WRAPPED], "json");
        let view = DeadLetterView::of(&attributes, &data);
        assert_eq!((view.attributes, view.data), (crowded, vec![0, 159, 146, 150]));
        assert!(!view.attributes_dropped);
        // Data at the size limit: the attributes are dropped, and the view says so.
        let big = vec![b'x'; MAX_MESSAGE_BYTES - 300];
        let long: BTreeMap<String, String> = (0..10).map(|i| (format!("a{i}"), "v".repeat(40))).collect();
        let (data, attributes) = with_reason.dead_letter(&long, &big);
        let view = DeadLetterView::of(&attributes, &data);
        assert!(view.attributes_dropped && view.attributes.is_empty() && view.data == big);
    }

    #[test]
    fn a_dead_letter_always_fits_and_loses_no_attribute_it_can_carry() {
        let letter = Stamp { reason: Some((DlqReason::AttributesOverLimit, "too many")), ..stamp() };
        let (data, fits) = letter.dead_letter(&attributes(3), b"payload");
        assert_eq!(
            (data.as_slice(), fits["a0"].as_str(), fits[REASON].as_str()),
            (&b"payload"[..], "v", "attributes_over_limit")
        );

        let many = attributes(150);
        let (data, wrapped) = letter.dead_letter(&many, b"payload");
        assert_eq!(wrapped[WRAPPED], "json");
        assert!(check(&wrapped, data.len()).is_ok());
        let body: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(body["attributes"].as_object().unwrap().len(), 150);
        assert_eq!(body["data"], "cGF5bG9hZA==");

        let huge = vec![b'x'; MAX_MESSAGE_BYTES - 2_000];
        let (data, bare) = letter.dead_letter(&many, &huge);
        assert_eq!(data.len(), huge.len());
        assert!(check(&bare, data.len()).is_ok());
        assert!(bare[DETAIL].contains("attributes dropped"), "{}", bare[DETAIL]);

        let at_limit = vec![b'x'; MAX_MESSAGE_BYTES - 60];
        let (data, minimal) = letter.dead_letter(&many, &at_limit);
        assert_eq!(minimal.keys().collect::<Vec<_>>(), [MESSAGE_ID, REASON]);
        assert!(check(&minimal, data.len()).is_ok());
    }
}
