//! What the downstream's answers do to the limits (docs/design.md: "When the downstream says wait"): a 429
//! or 503 with `Retry-After` pauses the rule's feedback target (its key, or the budget it names);
//! a 429, 408, 5xx or a timeout lowers the target's adaptive level when it has one. Used for the
//! limiter's own forwards, the dispatcher's deliveries to `overflow: { url }` targets, and for
//! `POST /v1/feedback`.

use drip_core::budgets::{Budget, PPM};
use drip_core::rules::Rule;
use drip_core::time::{Millis, format_rfc3339, wall_clock_millis};

/// The log line of a capped pause (an alert in terraform/monitoring.tf filters on it).
pub const LONG_PAUSE_CAPPED: &str =
    "the downstream asked to wait longer than max_pause: pause capped, read as overload";
use drip_store::{Store, StoreError};

use crate::metrics::ServiceMetrics;

/// One answer of the downstream.
#[derive(Debug, Clone, Copy)]
pub struct Signal {
    /// The HTTP status; `None` for a timeout or a failed connection.
    pub status: Option<u16>,
    /// When its `Retry-After` ends, if it was a 429 or 503 that had one.
    pub until: Option<Millis>,
}

impl Signal {
    /// Whether it lowers an adaptive level: the downstream is overloaded or failing.
    fn overloaded(&self) -> bool {
        matches!(self.status, None | Some(408 | 429 | 500..=599))
    }
}

/// What a signal changed.
#[derive(Debug, Clone, Default)]
pub struct Effect {
    /// `key` or `budget:<name>`.
    pub target: String,
    pub paused_until: Option<Millis>,
    /// The end the downstream asked for, when the rule's `max_pause` cut the pause short.
    pub asked_until: Option<Millis>,
    /// The adaptive level after it, when the target has one.
    pub adaptive_level: Option<f64>,
}

/// Applies `signal` to the key, or to `budget` when given, else to the budget the rule's
/// feedback names.
pub async fn apply(
    (store, metrics): (&dyn Store, &ServiceMetrics),
    rule: &Rule,
    key: &str,
    budget: Option<&Budget>,
    signal: Signal,
) -> Result<Effect, StoreError> {
    let budget = budget.or_else(|| rule.feedback_budget());
    if signal.overloaded() || signal.until.is_some() {
        // The console's "partner answers of the last minutes"; a count lost is no reason to fail.
        if let Err(error) = store.count_answer(rule, signal.status.unwrap_or(0)).await {
            tracing::debug!(rule = %rule.name, %error, "could not count a refusal");
        }
    }
    let target = budget.map_or_else(|| "key".to_owned(), |b| format!("budget:{}", b.name));
    // The metrics' label: a key's answers count for its rule (keys are too many for labels).
    let labelled = budget.map_or_else(|| format!("rule:{}", rule.name), |b| format!("budget:{}", b.name));
    // One answer pauses for at most max_pause: a longer Retry-After would dead-letter every event
    // of the target without the downstream being asked again. Asking that much is overload.
    let mut overloaded = signal.overloaded();
    let mut asked_until = None;
    let until = signal.until.map(|asked| {
        let (until, capped) = rule.capped_pause(asked, wall_clock_millis());
        if capped {
            asked_until = Some(asked);
            overloaded = true;
            metrics.shared.pause_capped(labelled.clone());
            tracing::warn!(rule = %rule.name, key, target, status = ?signal.status, until = %format_rfc3339(until), "{LONG_PAUSE_CAPPED}");
        }
        until
    });
    if let Some(until) = until {
        match budget {
            Some(budget) => store.pause_budget(budget, until).await?,
            None => store.pause(rule, key, until).await?,
        }
    }
    let level = match (overloaded, budget) {
        (false, _) => None,
        (true, Some(budget)) => store.signal_budget(budget).await?,
        (true, None) => store.signal(rule, key).await?,
    };
    let adaptive_level = level.map(|level| level as f64 / PPM as f64);
    if let Some(level) = adaptive_level {
        metrics.shared.adaptive_level(labelled, level);
        tracing::warn!(rule = %rule.name, key, target, status = ?signal.status, level, "the downstream is overloaded: adaptive limit lowered");
    }
    Ok(Effect { target, paused_until: until, asked_until, adaptive_level })
}
