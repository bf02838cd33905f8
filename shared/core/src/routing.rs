//! From an event to what must happen to it: which rule, which entity key, what cost, or why it
//! must be dead-lettered; and, once a slot is reserved, whether to forward now or delay.

use crate::event::Event;
pub use crate::outcome::DlqReason;
use crate::rules::{Classes, Cost, Mode, OnMissingKey, Rule, RuleSet};
use crate::schedule::{Reservation, Status};
use crate::template::{RenderError, cap_key};
use crate::time::Millis;

#[derive(Debug)]
pub enum Plan<'r> {
    /// `previous_key`: the event's key under the rule's `previous_key` template, when it has one
    /// and it renders to another key.
    Reserve {
        rule: &'r Rule,
        key: String,
        cost: u64,
        previous_key: Option<String>,
    },
    DeadLetter {
        rule: Option<&'r Rule>,
        key: Option<String>,
        reason: DlqReason,
        detail: String,
    },
}

pub fn plan<'r>(rules: &'r RuleSet, event: &Event) -> Plan<'r> {
    let Some(rule) = rules.find(&event.attributes) else {
        return Plan::DeadLetter {
            rule: None,
            key: None,
            reason: DlqReason::NoMatchingRule,
            detail: "no rule matches the message attributes".into(),
        };
    };
    let dead_letter = |key: Option<String>, reason, detail| Plan::DeadLetter { rule: Some(rule), key, reason, detail };
    let key = match (rule.key.render(event), &rule.on_missing_key) {
        (Ok(key), _) => cap_key(key),
        (Err(_), OnMissingKey::FallbackKey(fallback)) => cap_key(fallback.clone()),
        (Err(e), OnMissingKey::Dlq) => {
            let reason = match e {
                RenderError::NonJsonBody => DlqReason::NonJsonBody,
                _ => DlqReason::MissingKeyField,
            };
            return dead_letter(None, reason, format!("key: {e}"));
        }
    };
    let cost = match &rule.cost {
        Cost::Fixed(cost) => *cost,
        Cost::Template(template) => match template.render(event).map(|text| text.parse::<u64>()) {
            Ok(Ok(cost)) if cost >= 1 => cost,
            Ok(_) => {
                return dead_letter(Some(key), DlqReason::InvalidCost, "cost: not an integer of at least 1".into());
            }
            Err(e) => return dead_letter(Some(key), DlqReason::InvalidCost, format!("cost: {e}")),
        },
    };
    // A shadow rule reserves it anyway: the store answers that the cost exceeds a limit, which is
    // recorded as the would-be decision while the event is forwarded.
    if cost > rule.max_cost() && rule.mode == Mode::Enforce {
        let detail = format!("cost {cost} exceeds the largest the rule's limits allow, {}", rule.max_cost());
        return dead_letter(Some(key), DlqReason::CostExceedsLimit, detail);
    }
    // A rule with classes reserves by the key's class: its own FIFO under the key's calendar.
    let entity = |key: String| match &rule.classes {
        Some(classes) => Classes::entity(&key, classes.class_of(event)),
        None => key,
    };
    let key = entity(key);
    let previous_key = rule
        .previous_key
        .as_ref()
        .and_then(|template| template.render(event).ok())
        .map(|previous| entity(cap_key(previous)))
        .filter(|previous| *previous != key);
    Plan::Reserve { rule, key, cost, previous_key }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Forward,
    Delay,
    /// The key is throttled and its backlog waits in its queue (`Status::Parked`): the message
    /// is kept for the key's drain, which gives it a slot at the rate in force then.
    Park,
    DeadLetter(DlqReason),
}

impl Decision {
    /// Forward when the slot is at most `inline_wait` after the first answer (a redelivery is
    /// routed as the original was), delay when later.
    pub fn of(reservation: &Reservation, inline_wait: Millis) -> Self {
        match reservation.status {
            Status::MaxDelayExceeded => Decision::DeadLetter(DlqReason::MaxDelayExceeded),
            Status::CostExceedsLimit => Decision::DeadLetter(DlqReason::CostExceedsLimit),
            Status::Reserved if reservation.slot <= reservation.decided_at + inline_wait => Decision::Forward,
            Status::Reserved => Decision::Delay,
            Status::Parked => Decision::Park,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Forward => "forward",
            Decision::Delay => "delay",
            Decision::Park => "park",
            Decision::DeadLetter(_) => "dlq",
        }
    }

    /// As `drip-shadow-decision` says it: `forward`, `delay`, or `dlq:<reason>`.
    pub fn shadow_text(&self) -> String {
        match self {
            Decision::DeadLetter(reason) => format!("dlq:{}", reason.as_str()),
            other => other.as_str().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const RULES: &str = r#"
default_dlq_topic: default-dlq
rules:
  - name: sms
    match: { attributes: { event_type: sms } }
    key: "user_{data.user_id}"
    cost: "{data.parts}"
    limits: [{ limit: 5, per: 1s }]
    max_delay: 1h
    forward: { topic: sms-ready }
    overflow_topic: sms-overflow
  - name: kyc
    match: { attributes: { event_type: kyc } }
    key: "{attributes.tenant}"
    on_missing_key: { fallback_key: unknown-tenant }
    limits: [{ limit: 5, per: 1s }]
    max_delay: 1h
    forward: { url: "https://kyc.example.com/check" }
    overflow_topic: kyc-overflow
"#;

    fn event(kind: &str, data: &str) -> Event {
        Event::new("m1", BTreeMap::from([("event_type".to_owned(), kind.to_owned())]), data.as_bytes().to_vec())
    }

    fn reason(plan: Plan<'_>) -> Option<DlqReason> {
        match plan {
            Plan::DeadLetter { reason, .. } => Some(reason),
            Plan::Reserve { .. } => None,
        }
    }

    #[test]
    fn routes_by_attributes_and_renders_key_and_cost() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        match plan(&rules, &event("sms", r#"{"user_id":7,"parts":3}"#)) {
            Plan::Reserve { rule, key, cost, .. } => {
                assert_eq!((rule.name.as_str(), key.as_str(), cost), ("sms", "user_7", 3))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_unusable_event_has_its_reason() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        assert_eq!(reason(plan(&rules, &event("email", "{}"))), Some(DlqReason::NoMatchingRule));
        assert_eq!(reason(plan(&rules, &event("sms", r#"{"parts":1}"#))), Some(DlqReason::MissingKeyField));
        assert_eq!(reason(plan(&rules, &event("sms", "not json"))), Some(DlqReason::NonJsonBody));
        assert_eq!(reason(plan(&rules, &event("sms", r#"{"user_id":1,"parts":0}"#))), Some(DlqReason::InvalidCost));
        assert_eq!(reason(plan(&rules, &event("sms", r#"{"user_id":1,"parts":"x"}"#))), Some(DlqReason::InvalidCost));
        assert_eq!(
            reason(plan(&rules, &event("sms", r#"{"user_id":1,"parts":6}"#))),
            Some(DlqReason::CostExceedsLimit)
        );
    }

    #[test]
    fn an_entity_of_a_classed_rule_reserves_as_its_class_or_as_its_key_s_default_class() {
        let classed = RULES.replacen(
            "    key: \"{attributes.tenant}\"\n",
            "    key: \"{attributes.tenant}\"\n    classes: { from: \"{attributes.p}\", default: bulk, reserve: { live: 0.2 } }\n",
            1,
        );
        let rules = RuleSet::parse("rules.yaml", &classed).unwrap();
        let classes = rules.rule("kyc").and_then(|r| r.classes.as_ref()).expect("classes");
        assert_eq!(classes.of_entity("t1#live"), ("t1", "live"));
        assert_eq!(classes.of_entity("t1#bulk"), ("t1", "bulk"));
        // A key that waited before the rule had classes: its key's default class.
        assert_eq!(classes.of_entity("t1"), ("t1", "bulk"));
        assert_eq!(classes.of_entity("t1#vip"), ("t1#vip", "bulk"), "no class of the rule");
    }

    #[test]
    fn fallback_key_instead_of_dead_letter() {
        let rules = RuleSet::parse("rules.yaml", RULES).unwrap();
        match plan(&rules, &event("kyc", "")) {
            Plan::Reserve { key, .. } => assert_eq!(key, "unknown-tenant"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn decision_follows_slot_and_status() {
        let at =
            |slot, status| Reservation { slot, status, decided_at: 10, attempt: crate::schedule::Attempt::Decided };
        assert_eq!(Decision::of(&at(10, Status::Reserved), 0), Decision::Forward);
        assert_eq!(Decision::of(&at(11, Status::Reserved), 0), Decision::Delay);
        assert_eq!(Decision::of(&at(11, Status::Reserved), 1), Decision::Forward);
        assert_eq!(
            Decision::of(&at(11, Status::MaxDelayExceeded), 0),
            Decision::DeadLetter(DlqReason::MaxDelayExceeded)
        );
    }
}
