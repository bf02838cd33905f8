//! The event being scheduled: a Pub/Sub message's id, attributes and data.

use std::collections::BTreeMap;

#[derive(Debug)]
pub struct Event {
    pub id: String,
    /// The subscription it came through, when known (see [`MessageRef`]).
    pub subscription: Option<String>,
    pub attributes: BTreeMap<String, String>,
    pub data: Vec<u8>,
}

impl Event {
    pub fn new(id: impl Into<String>, attributes: BTreeMap<String, String>, data: Vec<u8>) -> Self {
        Self { id: id.into(), subscription: None, attributes, data }
    }

    pub fn with_subscription(mut self, subscription: Option<String>) -> Self {
        self.subscription = subscription.filter(|s| !s.is_empty());
        self
    }

    pub fn message_ref(&self) -> MessageRef {
        MessageRef::new(self.id.clone(), self.subscription.clone())
    }
}

/// Who a message is: Pub/Sub message ids are unique within a topic only, so the identity Drip
/// keys everything on (answer, task name, claim-check, dispatch marker) is the id together with
/// the subscription it came through.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageRef {
    pub id: String,
    /// The full subscription name, when the push said it.
    pub subscription: Option<String>,
}

impl MessageRef {
    pub fn new(id: impl Into<String>, subscription: Option<String>) -> Self {
        Self { id: id.into(), subscription: subscription.filter(|s| !s.is_empty()) }
    }

    /// `<id>@<12 hex digits of the subscription's SHA-256>`, or the id alone when no subscription
    /// is known. Short, so that millions of in-flight answers stay small in Redis.
    pub fn identity(&self) -> String {
        use sha2::{Digest, Sha256};
        match &self.subscription {
            None => self.id.clone(),
            Some(subscription) => {
                let digest = Sha256::digest(subscription.as_bytes());
                format!("{}@{}", self.id, hex::encode(&digest[..6]))
            }
        }
    }

    /// The identity of a message with these attributes: [`identity`](Self::identity), or for an
    /// event replayed from a dead-letter topic (`drip-replay-of`) the identity of the message it
    /// was, so that a dead letter replayed twice is one message to the limiter and the dispatcher.
    pub fn identity_with(&self, attributes: &BTreeMap<String, String>) -> String {
        match attributes.get(crate::attributes::REPLAY_OF) {
            Some(of) => format!("replay:{of}"),
            None => self.identity(),
        }
    }
}

/// The publish time a message's answer is filed under: its own, or for a replayed event its dead
/// letter's (`drip-replay-published`), the same on every replay of it.
pub fn filing_time(publish_time: Option<&str>, attributes: &BTreeMap<String, String>) -> Option<crate::time::Millis> {
    let at = match attributes.get(crate::attributes::REPLAY_OF) {
        Some(_) => attributes.get(crate::attributes::REPLAY_PUBLISHED).map(String::as_str),
        None => publish_time,
    };
    at.and_then(|at| crate::time::parse_rfc3339(at).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_id_from_two_subscriptions_is_two_messages() {
        let a = MessageRef::new("42", Some("projects/p/subscriptions/a".into()));
        let b = MessageRef::new("42", Some("projects/p/subscriptions/b".into()));
        assert_ne!(a.identity(), b.identity());
        assert_eq!(a.identity(), MessageRef::new("42", Some("projects/p/subscriptions/a".into())).identity());
        assert!(a.identity().starts_with("42@"));
        assert_eq!(MessageRef::new("42", Some(String::new())).identity(), "42");
    }
}
