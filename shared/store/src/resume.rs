//! An operator's pause and its undo, for a key or a budget, audited like an override change: a
//! pause holds a key (a partner asked for a quiet hour, an incident), a resume lifts it (or a
//! partner's `Retry-After`, or a `drip feedback` sent in error). The API, the console and the
//! CLI's Redis transport all pause and resume through here.

use drip_core::budgets::Budget;
use drip_core::rules::Rule;
use drip_core::time::{Millis, wall_clock_millis};
use serde::{Deserialize, Serialize};

use crate::overrides::{AuditEntry, Author, PauseChange, ResumeChange};
use crate::{request::StoreError, store::Store};

/// The longest pause an operator may set: longer is a change of the rules, not a pause.
pub const MAX_OPERATOR_PAUSE: Millis = 7 * drip_core::time::DAY;

/// What a pause did, and the pause in force for the key after it (its own or a budget's: the
/// latest end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Paused {
    pub change: PauseChange,
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub paused_until: Option<Millis>,
}

/// Pauses `key` (or `budget` when given) for `length` from now: no new slot of it before then
/// (slots already reserved keep their times; their tasks find the pause and wait it out). An
/// existing pause that ends later stays. Recorded in the rule's audit list.
pub async fn pause(
    store: &dyn Store,
    (rule, key, budget): (&Rule, &str, Option<&Budget>),
    length: Millis,
    author: Author<'_>,
) -> Result<Paused, StoreError> {
    let until = wall_clock_millis() + length.clamp(0, MAX_OPERATOR_PAUSE);
    let target = match budget {
        Some(budget) => {
            store.pause_budget(budget, until).await?;
            format!("budget:{}", budget.name)
        }
        None => {
            store.pause(rule, key, until).await?;
            "key".to_owned()
        }
    };
    let change = PauseChange {
        at: wall_clock_millis(),
        by: author.by.to_owned(),
        rule: rule.id.clone(),
        key: key.to_owned(),
        target,
        paused_until: until,
        reason: author.reason.map(str::to_owned),
    };
    store.record_audit(&AuditEntry::Pause(change.clone())).await?;
    let paused_until = if key.is_empty() { Some(until) } else { store.paused_until(rule, key).await? };
    Ok(Paused { change, paused_until })
}

/// What a resume did, and the pause still in force for the key after it (a budget's), if any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resumed {
    pub change: ResumeChange,
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub paused_until: Option<Millis>,
}

/// Lifts the pause of `key` (or of `budget` when given), records it in the rule's audit list, and
/// reads what holds the key back after it. Slots already reserved keep their times; new
/// reservations are no longer held back by the lifted pause.
pub async fn resume(
    store: &dyn Store,
    rule: &Rule,
    key: &str,
    budget: Option<&Budget>,
    author: Author<'_>,
) -> Result<Resumed, StoreError> {
    let (target, resumed_pause) = match budget {
        Some(budget) => (format!("budget:{}", budget.name), store.resume_budget(budget).await?),
        None => ("key".to_owned(), store.resume(rule, key).await?),
    };
    let change = ResumeChange {
        at: wall_clock_millis(),
        by: author.by.to_owned(),
        rule: rule.id.clone(),
        key: key.to_owned(),
        target,
        resumed_pause,
        reason: author.reason.map(str::to_owned),
    };
    store.record_audit(&AuditEntry::Resume(change.clone())).await?;
    let paused_until = if key.is_empty() { None } else { store.paused_until(rule, key).await? };
    Ok(Resumed { change, paused_until })
}
