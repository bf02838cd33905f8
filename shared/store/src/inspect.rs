//! What an entity's state says: the use of each limit, the last reserved slot, and the backlog
//! (reservations still ahead) with when it drains. The state is O(limits), not one entry per
//! reservation, so the backlog is estimated from the limit that holds the most.

use std::collections::HashMap;

use drip_core::rules::{Limit, Rule, Window};
use drip_core::schedule::state_id;
use drip_core::time::{Millis, format_rfc3339};
use redis::aio::ConnectionLike;
use serde::Serialize;

use crate::{EntityKeys, StoreError};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntityReport {
    pub rule: String,
    pub key: String,
    pub now: String,
    /// The latest slot reserved for this entity, if any is remembered.
    pub last_slot: Option<String>,
    /// Estimated cost reserved at times after now.
    pub backlog: u64,
    /// When the last reserved event goes (None: nothing is waiting).
    pub drains_at: Option<String>,
    pub limits: Vec<LimitReport>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    /// e.g. `100 per 1m (fixed)`.
    pub limit: String,
    /// Cost reserved in the current window (fixed: the epoch-aligned one holding now; sliding:
    /// the last `per`; gcra: what the bucket holds now).
    pub used_now: u64,
    pub capacity: u64,
    /// Estimated cost this limit holds after now.
    pub ahead: u64,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> crate::RedisStore<C> {
    /// What the entity's state says now (Redis `TIME`).
    pub async fn inspect(&self, rule: &Rule, key: &str) -> Result<EntityReport, StoreError> {
        let mut connection = self.connection();
        inspect(&mut connection, self.namespace(), rule, key).await
    }
}

async fn inspect<C: ConnectionLike + Send + Sync>(
    connection: &mut C,
    namespace: &str,
    rule: &Rule,
    key: &str,
) -> Result<EntityReport, StoreError> {
    let keys = EntityKeys::new(namespace, &rule.name, key, "-", 0, &rule.limits);
    let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(connection).await?;
    let now = seconds * 1_000 + micros / 1_000;
    let state: HashMap<String, i64> = redis::cmd("HGETALL").arg(&keys.state).query_async(connection).await?;
    let field = |limit: &Limit, suffix: &str| state.get(&format!("{}:{suffix}", state_id(limit))).copied();
    let last_slot = state.get("last").copied();
    let mut sliding_keys = keys.sliding.iter();
    let mut limits = Vec::new();
    for limit in &rule.limits {
        let (n, per) = (limit.limit as i64, limit.per);
        let (used_now, ahead) = match limit.window {
            Window::Fixed(_) => match (field(limit, "w"), field(limit, "u")) {
                (Some(window), Some(used)) => {
                    let current = now.div_euclid(per) * per;
                    if window == current {
                        (used, 0)
                    } else if window > current {
                        // FIFO filled every window between now's and the last one.
                        (n, used + n * ((window - current) / per - 1).max(0))
                    } else {
                        (0, 0)
                    }
                }
                _ => (0, 0),
            },
            Window::Sliding => {
                let zset = sliding_keys.next().cloned().unwrap_or_default();
                let entries: Vec<(String, i64)> =
                    redis::cmd("ZRANGE").arg(&zset).arg(0).arg(-1).arg("WITHSCORES").query_async(connection).await?;
                let base = field(limit, "b").unwrap_or(0);
                let mut previous = base;
                let (mut used, mut ahead) = (0, 0);
                for (time, cum) in entries {
                    let (time, cost) = (time.parse::<Millis>().unwrap_or(0), cum - previous);
                    previous = cum;
                    if time > now {
                        ahead += cost;
                    } else if time > now - per {
                        used += cost;
                    }
                }
                (used, ahead)
            }
            Window::Gcra { burst } => match (field(limit, "t"), field(limit, "r")) {
                (Some(tat), Some(rem)) => {
                    // Units the bucket holds: (TAT - now) / T, T = per / limit.
                    let held = (((tat - now) * n + rem) / per.max(1)).max(0);
                    (held.min(n.max(burst as i64)), (held - burst as i64 + 1).max(0))
                }
                _ => (0, 0),
            },
        };
        limits.push(LimitReport {
            limit: limit.to_string(),
            used_now: used_now as u64,
            capacity: limit.limit,
            ahead: ahead as u64,
        });
    }
    let waiting = last_slot.filter(|&slot| slot > now);
    Ok(EntityReport {
        rule: rule.name.clone(),
        key: key.to_owned(),
        now: format_rfc3339(now),
        last_slot: last_slot.map(format_rfc3339),
        backlog: if waiting.is_some() { limits.iter().map(|l| l.ahead).max().unwrap_or(0).max(1) } else { 0 },
        drains_at: waiting.map(format_rfc3339),
        limits,
    })
}
