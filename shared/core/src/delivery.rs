//! What a downstream's answer to a delivery (a rule's `forward: { url }`, read by the limiter, or
//! its `overflow: { url }`, read by the dispatcher) means for the event: one meaning, which both
//! services carry out the same way.

use crate::outcome::DlqReason;
use crate::time::Millis;

/// The target's answer, as the HTTP client classifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx; `cost` is what the call really cost, when the target said (`X-Drip-Cost`).
    Delivered { cost: Option<u64> },
    /// A 429 or 503 with `Retry-After`: wait until then.
    Wait { status: u16, until: Millis, retry_after: String },
    /// A 429 without `Retry-After`, a 408, a 5xx, a timeout or no connection (`status` `None`):
    /// worth another try later, and a sign of overload for an adaptive limit.
    Overloaded { status: Option<u16>, detail: String },
    /// Refused for good: a 3xx (following it would turn the POST into a bodiless GET and lose the
    /// event; `detail` names its `Location`) or any other 4xx. `detail`: `answered 302 …; Location: …`.
    Refused { detail: String },
}

/// What happens to the event after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// It is done; a cost the target reported corrects what the event booked.
    Delivered { cost: Option<u64> },
    /// The rule's feedback target pauses until then (an overload signal too), and the event gets
    /// a new slot after the pause, in a Cloud Task: never dropped, never hot-retried.
    Pause { until: Millis },
    /// A 429 that says no more than "too many": an overload signal (the adaptive level drops) and
    /// a new slot at once, under the lowered level, in a Cloud Task. Not a transport retry: that
    /// would hand the same event back at the transport's pace, not the limit's.
    Reslot,
    /// A 408, 5xx, timeout or no connection: an overload signal, and the event is left to its
    /// transport's retry (Pub/Sub redelivers the push; Cloud Tasks retries the task with backoff).
    Retry,
    /// No retry can deliver it: dead-lettered with this reason.
    DeadLetter(DlqReason),
}

impl Answer {
    pub fn delivery(&self) -> Delivery {
        match self {
            Answer::Delivered { cost } => Delivery::Delivered { cost: *cost },
            Answer::Wait { until, .. } => Delivery::Pause { until: *until },
            Answer::Overloaded { status: Some(429), .. } => Delivery::Reslot,
            Answer::Overloaded { .. } => Delivery::Retry,
            Answer::Refused { .. } => Delivery::DeadLetter(DlqReason::ForwardRejected),
        }
    }

    /// The downstream's status, when it answered one (for the overload signal and the logs).
    pub fn status(&self) -> Option<u16> {
        match self {
            Answer::Wait { status, .. } => Some(*status),
            Answer::Overloaded { status, .. } => *status,
            Answer::Delivered { .. } | Answer::Refused { .. } => None,
        }
    }

    /// What to say about it in a log line or a dead letter.
    pub fn detail(&self, target: &str) -> String {
        match self {
            Answer::Delivered { .. } => format!("{target} delivered"),
            Answer::Wait { status, retry_after, .. } => {
                format!("{target} answered {status}, Retry-After {retry_after}")
            }
            Answer::Overloaded { detail, .. } | Answer::Refused { detail } => format!("{target} {detail}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_has_one_meaning() {
        let overloaded = |status| Answer::Overloaded { status, detail: String::new() };
        let wait = Answer::Wait { status: 503, until: 5_000, retry_after: "5".into() };
        let delivered = Answer::Delivered { cost: Some(3) };
        assert_eq!(delivered.delivery(), Delivery::Delivered { cost: Some(3) });
        assert_eq!(wait.delivery(), Delivery::Pause { until: 5_000 });
        assert_eq!(overloaded(Some(429)).delivery(), Delivery::Reslot, "a 429 without Retry-After");
        for status in [Some(408), Some(500), Some(503), None] {
            assert_eq!(overloaded(status).delivery(), Delivery::Retry, "{status:?}");
        }
        let refused = Answer::Refused { detail: "answered 302; Location: /x".into() };
        assert_eq!(refused.delivery(), Delivery::DeadLetter(DlqReason::ForwardRejected));
        assert_eq!(refused.detail("forward URL"), "forward URL answered 302; Location: /x");
    }
}
