//! An audit entry as a line a person reads: what `drip limits history` prints and the console
//! shows, one wording for both.

use drip_core::time::{Millis, format_rfc3339};

use crate::overrides::{
    AuditEntry, CostChange, FeedbackChange, OverrideChange, OverrideView, PauseChange, ResumeChange,
};

impl AuditEntry {
    /// One line, ending in a newline.
    pub fn describe(&self) -> String {
        match self {
            AuditEntry::Override(change) => describe_override(change),
            AuditEntry::Feedback(call) => describe_feedback(call),
            AuditEntry::Pause(pause) => pause.describe(),
            AuditEntry::Resume(resume) => resume.describe(),
            AuditEntry::Cost(cost) => describe_cost(cost),
        }
    }

    /// When it happened.
    pub fn at(&self) -> Millis {
        match self {
            AuditEntry::Override(change) => change.at,
            AuditEntry::Feedback(call) => call.at,
            AuditEntry::Pause(pause) => pause.at,
            AuditEntry::Resume(resume) => resume.at,
            AuditEntry::Cost(cost) => cost.at,
        }
    }

    /// The key it named (empty for a budget).
    pub fn key(&self) -> &str {
        match self {
            AuditEntry::Override(change) => &change.key,
            AuditEntry::Feedback(call) => &call.key,
            AuditEntry::Pause(pause) => &pause.key,
            AuditEntry::Resume(resume) => &resume.key,
            AuditEntry::Cost(cost) => &cost.key,
        }
    }
}

fn by_at(by: &str, at: Millis, reason: Option<&str>) -> String {
    let reason = reason.map_or(String::new(), |reason| format!(": {reason}"));
    format!("(by {by} at {}{reason})", format_rfc3339(at))
}

/// `sms user_7 message m1 cost 3 (booked 1: applied) (by … at …)`.
fn describe_cost(cost: &CostChange) -> String {
    let booked = cost.booked.map_or(String::new(), |b| format!("booked {b}: "));
    let by = by_at(&cost.by, cost.at, None);
    format!(
        "{} {} message {} cost {} ({booked}{}) {by}\n",
        cost.rule, cost.key, cost.message_id, cost.actual, cost.outcome
    )
}

impl PauseChange {
    /// `payouts merchant_7 paused key until … (by … at …: reason)`.
    pub fn describe(&self) -> String {
        let by = by_at(&self.by, self.at, self.reason.as_deref());
        format!("{} {} paused {} until {} {by}\n", self.rule, self.key, self.target, format_rfc3339(self.paused_until))
    }
}

impl ResumeChange {
    /// `payouts merchant_7 resumed key: lifted the pause until … (by … at …: reason)`.
    pub fn describe(&self) -> String {
        let lifted = self.resumed_pause.map_or("there was no pause to lift".to_owned(), |until| {
            format!("lifted the pause until {}", format_rfc3339(until))
        });
        let by = by_at(&self.by, self.at, self.reason.as_deref());
        format!("{} {} resumed {}: {lifted} {by}\n", self.rule, self.key, self.target)
    }
}

fn show(o: Option<&OverrideView>) -> String {
    match o {
        None => "the rule's".into(),
        Some(OverrideView { limit, until: None }) => limit.to_string(),
        Some(OverrideView { limit, until: Some(until) }) => format!("{limit} until {}", format_rfc3339(*until)),
    }
}

fn describe_override(change: &OverrideChange) -> String {
    let by = by_at(&change.by, change.at, change.reason.as_deref());
    let (before, after) = (show(change.before.as_ref()), show(change.after.as_ref()));
    format!("{} {} {}: {before} -> {after} {by}\n", change.rule, change.key, change.limit)
}

/// `payouts merchant_7 feedback 429 (Retry-After 30 s): paused until … (was none), level 0.5 (by … at …)`.
fn describe_feedback(call: &FeedbackChange) -> String {
    let paused = |at: Option<Millis>| at.map_or("none".to_owned(), format_rfc3339);
    let retry_after = call.retry_after.map_or(String::new(), |s| format!(" (Retry-After {s} s)"));
    let level = call.adaptive_level.map_or(String::new(), |l| format!(", adaptive level {l}"));
    format!(
        "{} {} feedback {}{retry_after} on {}: paused until {} (was {}){level} {}\n",
        call.rule,
        call.key,
        call.status,
        call.target,
        paused(call.paused_after),
        paused(call.paused_before),
        by_at(&call.by, call.at, None)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_back_as_a_pause_not_a_resume() {
        let pause = PauseChange {
            at: 1_000,
            by: "ops@example.com".into(),
            rule: "payouts".into(),
            key: "merchant_7".into(),
            target: "key".into(),
            paused_until: 61_000,
            reason: Some("partner maintenance".into()),
        };
        let entry = AuditEntry::Pause(pause);
        let read: AuditEntry = serde_json::from_str(&serde_json::to_string(&entry).unwrap()).unwrap();
        assert_eq!(read, entry);
        assert_eq!(
            read.describe(),
            "payouts merchant_7 paused key until 1970-01-01T00:01:01.000Z (by ops@example.com at 1970-01-01T00:00:01.000Z: partner maintenance)\n"
        );
    }
}
