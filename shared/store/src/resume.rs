//! Lifting a pause: an operator's undo of a partner's `Retry-After` (or of a `drip feedback` sent
//! in error), for a key or a budget, audited like an override change. The API and the CLI's Redis
//! transport both resume through here.

use drip_core::budgets::Budget;
use drip_core::rules::Rule;
use drip_core::time::{Millis, wall_clock_millis};
use serde::{Deserialize, Serialize};

use crate::{overrides::AuditEntry, overrides::Author, overrides::ResumeChange, request::StoreError, store::Store};

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
