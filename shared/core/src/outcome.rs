//! Why an event is dead-lettered and what became of it: one enum each, `as_str` in one place (the
//! `drip-reason` attribute, the `outcome` metric label and the `decision` log field).

use std::fmt;

/// Why an event goes to a dead-letter topic; `as_str` is the `drip-reason` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DlqReason {
    /// The push request is not a Pub/Sub push envelope (or has no message id).
    MalformedEnvelope,
    /// The message data is not base64.
    BadBase64,
    NoMatchingRule,
    MissingKeyField,
    NonJsonBody,
    InvalidCost,
    CostExceedsLimit,
    MaxDelayExceeded,
    /// The forward URL refused the event for good (a 3xx or a 4xx other than 429).
    ForwardRejected,
    /// Too large for a task and over `DRIP_CLAIM_CHECK_MAX_BYTES`.
    PayloadTooLarge,
    /// Over Pub/Sub's 100 attributes, 256-byte names or 1,024-byte values once Drip adds its own.
    AttributesOverLimit,
    /// A key or attribute that cannot travel in an HTTP header to a forward URL.
    InvalidHeaderValue,
    /// Over Pub/Sub's 10 MB per message once Drip adds its attributes.
    MessageTooLarge,
    /// The claim-checked payload of a task is gone (expired, or Redis lost it).
    ClaimCheckMissing,
    /// A task body that is not Drip's.
    MalformedTask,
    /// A task of Drip's whose overflow topic no rule names any more (rule edited, renamed, removed).
    OverflowTopicRetired,
    /// The dispatch kept failing until the queue's last attempt.
    DispatchFailed,
    /// Cloud Tasks refused the task as invalid (no retry can change that).
    TaskRejected,
}

impl DlqReason {
    pub const ALL: [DlqReason; 18] = [
        Self::MalformedEnvelope,
        Self::BadBase64,
        Self::NoMatchingRule,
        Self::MissingKeyField,
        Self::NonJsonBody,
        Self::InvalidCost,
        Self::CostExceedsLimit,
        Self::MaxDelayExceeded,
        Self::ForwardRejected,
        Self::PayloadTooLarge,
        Self::AttributesOverLimit,
        Self::InvalidHeaderValue,
        Self::MessageTooLarge,
        Self::ClaimCheckMissing,
        Self::MalformedTask,
        Self::OverflowTopicRetired,
        Self::DispatchFailed,
        Self::TaskRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MalformedEnvelope => "malformed_envelope",
            Self::BadBase64 => "bad_base64",
            Self::NoMatchingRule => "no_matching_rule",
            Self::MissingKeyField => "missing_key_field",
            Self::NonJsonBody => "non_json_body",
            Self::InvalidCost => "invalid_cost",
            Self::CostExceedsLimit => "cost_exceeds_limit",
            Self::MaxDelayExceeded => "max_delay_exceeded",
            Self::ForwardRejected => "forward_rejected",
            Self::PayloadTooLarge => "payload_too_large",
            Self::AttributesOverLimit => "attributes_over_limit",
            Self::InvalidHeaderValue => "invalid_header_value",
            Self::MessageTooLarge => "message_too_large",
            Self::ClaimCheckMissing => "claim_check_missing",
            Self::MalformedTask => "malformed_task",
            Self::OverflowTopicRetired => "overflow_topic_retired",
            Self::DispatchFailed => "dispatch_failed",
            Self::TaskRejected => "task_rejected",
        }
    }

    /// The reason a `drip-reason` attribute names.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == text)
    }

    /// Dead letters Drip could not read at all (not a push envelope, not base64, not a task of
    /// Drip's): replayed as they are, they are dead-lettered again, so a replay takes them only
    /// when asked for by reason.
    pub fn is_unreadable(self) -> bool {
        matches!(self, Self::MalformedEnvelope | Self::BadBase64 | Self::MalformedTask)
    }

    /// Dead letters that mean an upstream flood or lost work: logged at ERROR.
    pub fn is_alarming(self) -> bool {
        matches!(
            self,
            Self::MaxDelayExceeded | Self::ClaimCheckMissing | Self::OverflowTopicRetired | Self::DispatchFailed
        )
    }
}

impl fmt::Display for DlqReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the limiter or the dispatcher did with one request: the `outcome` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Limiter: forwarded now (or after an inline wait).
    Forward,
    /// Limiter: a task was created for a later slot.
    Delay,
    /// Dispatcher: a wake task drained its key's parked events.
    Drained,
    /// Its key is throttled: the event waits unbooked in the key's queue, and the key's drain gives
    /// it a slot at the rate in force then.
    Parked,
    /// Limiter: a redelivery of a message already acted upon, acked without acting again.
    Redelivered,
    /// Another attempt at the same message is acting on it now: answered 503, retried later.
    Busy,
    /// Dispatcher: published to the rule's overflow topic.
    Published,
    /// Dispatcher: a second run of a task already published.
    Duplicate,
    /// Dispatcher: the `overflow: { url }` target said to wait; a new task holds the event's new slot.
    Rescheduled,
    /// A transient failure: answered 5xx, retried.
    Retry,
    /// Dispatcher: a request without Cloud Tasks' headers, unsealed, or with a bad signature.
    NotATask,
    /// Dispatcher: a sealed task run after its seal's expiry (a replay): refused.
    TaskExpired,
    /// Dispatcher: a sealed task run before its slot: answered 503, tried again later.
    Early,
    /// Dispatcher: an unsigned task naming a topic no rule owns (refused; never an open relay).
    UnknownOverflowTopic,
    DeadLetter(DlqReason),
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Delay => "delay",
            Self::Parked => "parked",
            Self::Drained => "drained",
            Self::Redelivered => "redelivered",
            Self::Busy => "busy",
            Self::Published => "published",
            Self::Duplicate => "duplicate",
            Self::Rescheduled => "rescheduled",
            Self::Retry => "retry",
            Self::NotATask => "not_a_task",
            Self::TaskExpired => "task_expired",
            Self::Early => "early",
            Self::UnknownOverflowTopic => "unknown_overflow_topic",
            Self::DeadLetter(reason) => reason.as_str(),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_reason_has_its_own_snake_case_name() {
        let names: HashSet<&str> = DlqReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), DlqReason::ALL.len());
        assert!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')));
    }
}
