use std::sync::LazyLock;

use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{Reservation, Status, state_id};
use drip_core::time::{HOUR, MINUTE, Millis};
use redis::Script;
use redis::aio::ConnectionLike;

use crate::{EntityKeys, Reserved, SlotRequest, SlotStore, StoreError};

/// How long a message's answer outlives `max_delay`, for redeliveries that come late.
pub const ANSWER_MARGIN: Millis = HOUR;
/// How long an entity's state outlives its last slot plus its longest window.
pub const STATE_MARGIN: Millis = MINUTE;

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/reserve.lua")));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/complete.lua")));

/// Reservations in Redis or Redis Cluster. `C` is any async connection: a multiplexed connection,
/// a connection manager, or a cluster connection; cloning it must be cheap.
#[derive(Debug, Clone)]
pub struct RedisStore<C> {
    connection: C,
    namespace: String,
}

impl<C> RedisStore<C> {
    pub fn new(connection: C, namespace: impl Into<String>) -> Self {
        Self { connection, namespace: namespace.into() }
    }

    pub fn keys(&self, request: &SlotRequest<'_>) -> EntityKeys {
        EntityKeys::new(&self.namespace, request.rule, request.key, request.message_id, request.limits)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> SlotStore for RedisStore<C> {
    async fn reserve(&self, request: &SlotRequest<'_>) -> Result<Reserved, StoreError> {
        let keys = self.keys(request);
        let longest_window = request.limits.iter().map(|l| l.per).max().unwrap_or(0);
        let mut invocation = RESERVE.prepare_invoke();
        invocation.key(&keys.state).key(&keys.answer);
        for sliding in &keys.sliding {
            invocation.key(sliding);
        }
        invocation
            .arg(request.now.map(|now| now.to_string()).unwrap_or_default())
            .arg(request.cost)
            .arg(request.max_delay)
            .arg(request.max_delay + ANSWER_MARGIN)
            .arg(longest_window + STATE_MARGIN)
            .arg(request.limits.len());
        let mut sliding_index = 2;
        for limit in request.limits {
            let extra = match limit.window {
                Window::Sliding => {
                    sliding_index += 1;
                    sliding_index
                }
                Window::Gcra { burst } => burst,
                Window::Fixed(_) => 0,
            };
            invocation.arg(script_kind(limit)).arg(state_id(limit)).arg(limit.per).arg(limit.limit).arg(extra);
        }
        let mut connection = self.connection.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut connection).await?;
        let &[slot, late, replayed, now, decided_at, completed] = reply.as_slice() else {
            return Err(StoreError::UnexpectedReply(format!("{reply:?}")));
        };
        let status = if late == 1 { Status::MaxDelayExceeded } else { Status::Reserved };
        Ok(Reserved {
            reservation: Reservation { slot, status, replayed: replayed == 1, decided_at, completed: completed == 1 },
            now,
        })
    }

    async fn complete(&self, request: &SlotRequest<'_>) -> Result<(), StoreError> {
        let keys = self.keys(request);
        let mut connection = self.connection.clone();
        let _: i64 = COMPLETE.key(&keys.answer).invoke_async(&mut connection).await?;
        Ok(())
    }
}

fn script_kind(limit: &Limit) -> &'static str {
    match limit.window {
        Window::Fixed(Placement::Start) => "fixed",
        Window::Fixed(Placement::Spread) => "spread",
        Window::Sliding => "sliding",
        Window::Gcra { .. } => "gcra",
    }
}
