//! The keys of a rule whose backlogs drain last, for the console: found by a bounded `SCAN` of the
//! rule's state hashes (nothing on any event's path keeps an index of them), each with its
//! frontier (its last slot), latest first. A single Redis only: on a Redis Cluster, `SCAN` goes
//! to one node per call, so the console searches by key there instead (`BusyKeys::unsupported`).

use drip_core::rules::Rule;
use drip_core::time::Millis;
use redis::aio::ConnectionLike;
use serde::Serialize;

use crate::keys::{RuleRef, field, unescape};
use crate::redis_store::RedisStore;
use crate::request::StoreError;

/// One key of a rule and its last slot (the end of its backlog, if that is after now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BusyKey {
    pub key: String,
    pub last_slot: Millis,
}

/// A rule's keys, the latest frontier first, at most the count asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BusyKeys {
    pub keys: Vec<BusyKey>,
    /// How many state hashes of the rule the search met.
    pub examined: usize,
    /// Whether it saw the whole keyspace (`false`: it stopped at its bound, so a busier key may
    /// exist: search for it by name).
    pub complete: bool,
    /// Why no list could be made (a Redis Cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

impl BusyKeys {
    /// The `count` latest of `found` (key, frontier), a class's entities counted as their key.
    pub fn ranked(found: impl IntoIterator<Item = (String, Millis)>, count: usize, complete: bool) -> Self {
        let mut by_key = std::collections::BTreeMap::<String, Millis>::new();
        let mut examined = 0;
        for (key, last_slot) in found {
            examined += 1;
            let latest = by_key.entry(key).or_insert(last_slot);
            *latest = (*latest).max(last_slot);
        }
        let mut keys: Vec<BusyKey> = by_key.into_iter().map(|(key, last_slot)| BusyKey { key, last_slot }).collect();
        keys.sort_by(|a, b| b.last_slot.cmp(&a.last_slot).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(count);
        Self { keys, examined, complete, unsupported: None }
    }
}

/// `SCAN`'s `COUNT` hint per call.
const SCAN_STEP: usize = 1_000;

/// A glob that matches `text` only.
fn glob_literal(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// Where a rule's entities keep their state, as a `SCAN` pattern, and how to read an entity back
/// from a name the pattern matched.
struct StatePattern {
    glob: String,
    /// What precedes the key in a state hash's name: `{rule|` alone, or `}:rule|` under a
    /// budget's tag.
    before_key: String,
}

impl StatePattern {
    fn of(namespace: &str, rule: RuleRef<'_>) -> Self {
        let (ns, id) = (glob_literal(namespace), glob_literal(rule.id));
        let classes = if rule.classed { "*" } else { "" };
        match rule.tag {
            Some(_) => Self { glob: format!("{ns}:{{b:*}}:{id}|*:state"), before_key: format!("}}:{}|", rule.id) },
            None => Self { glob: format!("{ns}:{{{id}|*}}{classes}:state"), before_key: format!(":{{{}|", rule.id) },
        }
    }

    fn key_of(&self, name: &str) -> Option<String> {
        let at = name.find(&self.before_key)? + self.before_key.len();
        let rest = name[at..].strip_suffix(":state")?;
        // Plain: `key}` (a class's entity: `key}#class`, read as its key); under a tag: `key`
        // (`key#class`, read whole: the caller scopes it with the rule's classes).
        let escaped = match rest.find('}') {
            Some(end) => &rest[..end],
            None => rest,
        };
        Some(unescape(escaped))
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    /// Up to `count` keys of `rule`, the latest frontier first, from at most `examine` state
    /// hashes.
    pub(crate) async fn busiest(&self, rule: &Rule, count: usize, examine: usize) -> Result<BusyKeys, StoreError> {
        let mut connection = self.connection();
        // A Redis without cluster support refuses CLUSTER INFO.
        let cluster: redis::RedisResult<redis::Value> =
            redis::cmd("CLUSTER").arg("INFO").query_async(&mut connection).await;
        if cluster.is_ok() {
            return Ok(BusyKeys {
                unsupported: Some("a Redis Cluster: search for a key by name".into()),
                ..BusyKeys::default()
            });
        }
        let pattern = StatePattern::of(self.namespace(), RuleRef::of(rule));
        // A rule whose keys are few among many others' would make a long walk: it stops after ten
        // keyspace keys per state hash it may examine.
        let most_calls = examine.div_ceil(SCAN_STEP).max(1) * 10;
        let (mut cursor, mut names, mut calls) = (0u64, Vec::new(), 0);
        loop {
            calls += 1;
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern.glob)
                .arg("COUNT")
                .arg(SCAN_STEP)
                .query_async(&mut connection)
                .await?;
            names.extend(batch);
            cursor = next;
            if cursor == 0 || names.len() >= examine || calls >= most_calls {
                break;
            }
        }
        names.truncate(examine);
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("HMGET").arg(name).arg(field::FRONTIER).arg(field::LEGACY_FRONTIER);
        }
        let frontiers: Vec<(Option<Millis>, Option<Millis>)> =
            if names.is_empty() { Vec::new() } else { pipe.query_async(&mut connection).await? };
        let found = names.iter().zip(frontiers).filter_map(|(name, (frontier, legacy))| {
            // A class's entity counts as its key's; a bare key holding a `#` as itself.
            let entity = pattern.key_of(name)?;
            Some((rule.scope_of(&entity).to_owned(), frontier.or(legacy)?))
        });
        Ok(BusyKeys::ranked(found, count, cursor == 0))
    }
}

#[cfg(test)]
mod tests {
    use drip_core::rules::{Limit, Placement, Window};

    use super::*;
    use crate::keys::EntityKeys;

    fn state_of(rule: RuleRef<'_>, key: &str) -> String {
        let limits = [Limit::new(1, 1_000, Window::Fixed(Placement::Start)).unwrap()];
        EntityKeys::of_entity("drip", rule, key, &limits).state
    }

    #[test]
    fn the_key_is_read_back_from_every_layout_of_state_hash() {
        let plain = RuleRef::plain("pay*outs");
        let tagged = RuleRef { tag: Some("shared"), ..RuleRef::plain("payouts") };
        let classed = RuleRef { classed: true, ..RuleRef::plain("payouts") };
        for (rule, entity, key) in [
            (plain, "merchant_{7}%", "merchant_{7}%"),
            (tagged, "a|b}", "a|b}"),
            (classed, "m1#live", "m1"),
            (RuleRef { classed: true, ..tagged }, "m2#bulk", "m2#bulk"),
        ] {
            let pattern = StatePattern::of("drip", rule);
            assert_eq!(pattern.key_of(&state_of(rule, entity)).as_deref(), Some(key), "{entity} under {rule:?}");
        }
        assert_eq!(StatePattern::of("drip", plain).glob, "drip:{pay\\*outs|*}:state");
        assert_eq!(StatePattern::of("drip", tagged).glob, "drip:{b:*}:payouts|*:state");
    }

    #[test]
    fn ranking_puts_the_latest_frontier_first_and_counts_a_key_s_classes_once() {
        let found = [("a".to_owned(), 5), ("b".to_owned(), 9), ("a".to_owned(), 12), ("c".to_owned(), 1)];
        let ranked = BusyKeys::ranked(found, 2, true);
        assert_eq!(ranked.examined, 4);
        let keys: Vec<_> = ranked.keys.iter().map(|k| (k.key.as_str(), k.last_slot)).collect();
        assert_eq!(keys, [("a", 12), ("b", 9)]);
    }
}
