//! A rule's downstream refusals by minute (429s, 5xx, timeouts: what `drip_service::feedback`
//! applies), for the console's "partner answers of the last minutes". One small hash per rule and
//! minute, `status -> count`, that expires on its own; written on a refusal's path only.

use std::collections::BTreeMap;

use drip_core::rules::Rule;
use drip_core::time::{MINUTE, Millis};
use redis::aio::ConnectionLike;

use crate::redis_store::RedisStore;
use crate::request::StoreError;

/// How long a minute's counts are kept.
pub const ANSWERS_KEPT: Millis = 20 * MINUTE;

/// `<namespace>:{answers:<rule>}:<minute>`: every minute of a rule on one slot.
fn minute_key(namespace: &str, rule: &str, minute: Millis) -> String {
    format!("{namespace}:{{answers:{rule}}}:{minute}")
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    pub(crate) async fn count_refusal(&self, rule: &Rule, status: u16, now: Millis) -> Result<(), StoreError> {
        let key = minute_key(self.namespace(), &rule.id, now.div_euclid(MINUTE));
        let mut pipe = redis::pipe();
        pipe.hincr(&key, status, 1).ignore().pexpire(&key, ANSWERS_KEPT).ignore();
        pipe.query_async::<()>(&mut self.connection()).await?;
        Ok(())
    }

    pub(crate) async fn refusals_since(
        &self,
        rule: &Rule,
        (since, now): (Millis, Millis),
    ) -> Result<BTreeMap<u16, u64>, StoreError> {
        let minutes: Vec<Millis> = (since.div_euclid(MINUTE)..=now.div_euclid(MINUTE)).collect();
        let mut pipe = redis::pipe();
        for &minute in &minutes {
            pipe.hgetall(minute_key(self.namespace(), &rule.id, minute));
        }
        let each: Vec<BTreeMap<u16, u64>> = pipe.query_async(&mut self.connection()).await?;
        Ok(sum(each))
    }
}

/// The counts of several minutes, added up by status.
pub(crate) fn sum(minutes: impl IntoIterator<Item = BTreeMap<u16, u64>>) -> BTreeMap<u16, u64> {
    let mut total = BTreeMap::new();
    for minute in minutes {
        for (status, count) in minute {
            *total.entry(status).or_default() += count;
        }
    }
    total
}
