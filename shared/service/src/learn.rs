//! What the partner says of its limits, acted on (docs/rules.md: "Learning the partner's limits"),
//! for a rule with `learn:`. Read from every answer of a forward or overflow URL and from the
//! headers a consumer passes to `/v1/feedback`:
//!
//! - a policy whose remaining count is 0 with a reset: the key waits until the reset, as after a
//!   `Retry-After` (the rule's feedback target is paused, capped by `max_pause`); so does a
//!   `Retry-After` on an answer that delivered;
//! - a policy whose quota is below the rule's limit of the same period: a learned limit, an
//!   override of that limit for the key (by `partner-headers`, so `drip limits history` and
//!   `drip inspect` say where it came from), ending [`LEARNED_FOR`] after the partner last said it;
//!   never above the rules file's count unless the rule's `above_rules`;
//! - a remaining count below what Drip holds left of that limit's window now (another client
//!   shares the partner's quota): that window's count in force is lowered to what Drip used of it
//!   plus what the partner says remains, until the window ends.
//!
//! What is learned is only ever a pause or an override: the reservation already honours both, so
//! a learned limit keeps every window exact. Nothing here stops a delivery: a store error is logged.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use drip_core::partner::PartnerSays;
use drip_core::rules::Rule;
use drip_core::schedule::LimitOverride;
use drip_core::time::{Millis, SECOND, format_rfc3339};
use drip_store::{Author, Store, StoreError};

use crate::feedback::{self, Signal};
use crate::metrics::ServiceMetrics;

/// Who a learned limit's audit record names.
pub const LEARNED_BY: &str = drip_store::LEARNED_BY;
/// Its reason, which `drip inspect` and `drip limits history` show.
pub const LEARNED_REASON: &str = "learned from the partner's headers";
/// How long a learned limit lasts after the partner last said it, at least: twice its window.
pub const LEARNED_FOR: Millis = 30 * SECOND;

/// What one answer changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learned {
    /// The pause it set (a remaining count of 0, or a Retry-After on a delivered answer).
    pub paused_until: Option<Millis>,
    /// Each limit it set, as `limit`, the count and its end.
    pub limits: Vec<(String, u64, Millis)>,
}

/// What this process last wrote for a key's limit (count, end), so that an answer that says the
/// same writes nothing; by store, rule id, key and limit. Bounded: emptied past [`REMEMBERED`].
type Remembered = HashMap<(usize, String, String, String), (u64, Millis)>;
static WRITTEN: LazyLock<Mutex<Remembered>> = LazyLock::new(Mutex::default);
/// When this process last compared a key's window with the partner's remaining count.
static COMPARED: LazyLock<Mutex<Remembered>> = LazyLock::new(Mutex::default);
const REMEMBERED: usize = 50_000;

/// Acts on what one answer said. `delivered`: the answer delivered the event (a refusal's own
/// `Retry-After` is acted on by the refusal's path, not twice here).
pub async fn act(
    (store, metrics): (&dyn Store, &ServiceMetrics),
    (rule, key): (&Rule, &str),
    says: &PartnerSays,
    delivered: bool,
    now: Millis,
) -> Learned {
    let Some(learn) = &rule.learn else { return Learned::default() };
    for ignored in &says.ignored {
        log_once(rule, ignored);
    }
    let mut learned = Learned::default();
    // A policy spent: the key waits for its reset. A reset said in whole seconds overshoots the
    // window it ends: where the policy holds one of the rule's limits, the wait ends no later than
    // that limit's next window (a partner whose windows are not Drip's says so with a 429).
    let spent = says
        .remaining
        .iter()
        .filter(|r| r.remaining == 0)
        .filter_map(|r| {
            let next_window = says
                .policy_of(r)
                .and_then(|policy| learn.limit_for(&rule.limits, policy))
                .map(|limit| now - now.rem_euclid(limit.per()) + limit.per());
            Some(r.resets_at?.min(next_window.unwrap_or(Millis::MAX)))
        })
        .max();
    let wait = spent.into_iter().chain(says.retry_until.filter(|_| delivered)).max().filter(|&until| until > now);
    if let Some(until) = wait {
        let signal = Signal { status: Some(200), until: Some(until) };
        match feedback::apply((store, metrics), rule, key, None, signal).await {
            Ok(effect) => learned.paused_until = effect.paused_until,
            Err(error) => {
                tracing::warn!(rule = %rule.name, key, %error, "could not pause as the partner's headers said")
            }
        }
    }
    for policy in &says.policies {
        let Some(limit) = learn.limit_for(&rule.limits, policy) else { continue };
        let count = learn.learned_count(limit.limit(), policy.quota);
        if count == limit.limit() {
            continue;
        }
        let lasts = LEARNED_FOR.max(2 * limit.per());
        if let Some(set) = set_learned(store, metrics, (rule, key), limit, (count, now + lasts), now).await {
            learned.limits.push(set);
        }
    }
    // The partner has less left than Drip thinks: another client shares its quota.
    for remaining in says.remaining.iter().filter(|r| r.remaining > 0) {
        let Some(policy) = says.policy_of(remaining) else { continue };
        let Some(limit) = learn.limit_for(&rule.limits, policy) else { continue };
        let per = limit.per();
        let window_ends = now - now.rem_euclid(per) + per;
        if !first_look((store, rule, key, limit), window_ends) {
            continue;
        }
        let report = match drip_store::inspect_key(store, rule, key).await {
            Ok(report) => report,
            Err(error) => {
                tracing::warn!(rule = %rule.name, key, %error, "could not compare with the partner's remaining count");
                continue;
            }
        };
        let shown = limit.to_string();
        let Some(row) = report.limits.iter().find(|row| row.limit == shown) else { continue };
        let holds = row.used_now + remaining.remaining;
        if holds < row.capacity {
            let ends = remaining.resets_at.unwrap_or(window_ends).min(window_ends);
            if let Some(set) = set_learned(store, metrics, (rule, key), limit, (holds, ends), now).await {
                learned.limits.push(set);
            }
        }
    }
    learned
}

/// Writes the learned count of `limit` until `until`, unless this process wrote the same count
/// lately (a refresh only once half its life is gone) or an override in force counts less.
async fn set_learned(
    store: &dyn Store,
    metrics: &ServiceMetrics,
    (rule, key): (&Rule, &str),
    limit: &drip_core::rules::Limit,
    (count, until): (u64, Millis),
    now: Millis,
) -> Option<(String, u64, Millis)> {
    let remembered = (store_id(store), rule.id.clone(), key.to_owned(), drip_core::schedule::override_id(limit));
    let before = lock(&WRITTEN).get(&remembered).copied();
    if let Some((written, ends)) = before
        && written == count
        && ends - now > (until - now) / 2
    {
        return None;
    }
    let result: Result<(), StoreError> = async {
        let overrides = store.overrides(rule, key).await?;
        let lower = overrides
            .get(&drip_core::schedule::override_id(limit))
            .filter(|o| o.in_force(now))
            .is_some_and(|o| o.limit < count);
        if lower && before.is_none() {
            // An operator's lower override stands.
            return Ok(());
        }
        let author = Author { by: LEARNED_BY, reason: Some(LEARNED_REASON) };
        store
            .change_override(rule, key, limit, Some(LimitOverride { limit: count, until: Some(until) }), author)
            .await?;
        Ok(())
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(rule = %rule.name, key, %error, "could not set the limit the partner's headers said");
        return None;
    }
    let mut written = lock(&WRITTEN);
    if written.len() >= REMEMBERED {
        written.clear();
    }
    written.insert(remembered, (count, until));
    if before.map(|(c, _)| c) != Some(count) {
        metrics.shared.learned_limit_changed(format!("rule:{}", rule.name));
        tracing::info!(rule = %rule.name, key, limit = %limit, count, until = %format_rfc3339(until), "{LEARNED_REASON}");
    }
    Some((limit.to_string(), count, until))
}

/// Whether this process has not yet compared this window of the key's limit.
fn first_look(
    (store, rule, key, limit): (&dyn Store, &Rule, &str, &drip_core::rules::Limit),
    window_ends: Millis,
) -> bool {
    let mut compared = lock(&COMPARED);
    if compared.len() >= REMEMBERED {
        compared.clear();
    }
    let at = (store_id(store), rule.id.clone(), key.to_owned(), drip_core::schedule::override_id(limit));
    compared.insert(at, (0, window_ends)).is_none_or(|(_, ends)| ends != window_ends)
}

fn store_id(store: &dyn Store) -> usize {
    std::ptr::from_ref(store).cast::<()>() as usize
}

fn lock(map: &Mutex<Remembered>) -> std::sync::MutexGuard<'_, Remembered> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logs a value the partner sent that Drip left out, once per rule and text.
fn log_once(rule: &Rule, ignored: &str) {
    static SEEN: LazyLock<Mutex<std::collections::HashSet<String>>> = LazyLock::new(Mutex::default);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.len() < REMEMBERED && seen.insert(format!("{}\n{ignored}", rule.id)) {
        tracing::warn!(rule = %rule.name, "the partner's rate-limit header was left out: {ignored}");
    }
}
