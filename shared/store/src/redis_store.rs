use std::sync::LazyLock;

use drip_core::budgets::{Adaptive, Budget, adaptive_window};
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{Reservation, Status, override_id, state_id};
use drip_core::time::{DAY, HOUR, MINUTE, Millis};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, Script};

use crate::keys::{ANSWER_BUCKET, budget_key, dispatch_key, payload_key};
use crate::{EntityKeys, Reserved, SlotRequest, SlotStore, StoreError};

/// How long a message's answer outlives `max_delay`, for redeliveries that come late.
pub const ANSWER_MARGIN: Millis = HOUR;
/// How long an entity's state outlives its last slot plus its longest window.
pub const STATE_MARGIN: Millis = MINUTE;
/// How long the dispatcher remembers a published task (Cloud Tasks rarely runs one twice, soon).
pub const DISPATCHED_MEMORY: Millis = DAY;

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/reserve.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/release.lua")));
static DISPATCH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/dispatch.lua")));

/// What the dispatcher may do with a task's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchClaim {
    /// This attempt publishes; it must then call `finish_dispatch` or `release_dispatch`.
    Acquired,
    /// Another attempt is publishing it now.
    Busy,
    /// Already published.
    Done,
}

/// One message of one entity, as the dispatcher names it.
#[derive(Debug, Clone, Copy)]
pub struct MessageOf<'a> {
    pub rule: &'a str,
    pub key: &'a str,
    /// `MessageRef::identity`.
    pub message: &'a str,
}

/// Reservations, claim-checked payloads and dispatch markers in Redis or Redis Cluster. `C` is any
/// async connection: a multiplexed connection, a connection manager, or a cluster connection;
/// cloning it must be cheap.
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
        EntityKeys::new(
            &self.namespace,
            request.rule_ref(),
            request.key,
            request.message_id,
            request.published,
            request.limits,
        )
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    pub(crate) fn connection(&self) -> C {
        self.connection.clone()
    }

    /// Rewrites the message's answer as completed. Rust knows the whole answer, so this is a plain
    /// HSET and PEXPIRE in one round trip, not a script (it is on every push's path); the expiry is
    /// the one reserve.lua gave the hash.
    async fn mark_completed(&self, request: &SlotRequest<'_>, reserved: &Reserved) -> Result<(), StoreError> {
        let keys = self.keys(request);
        let base = keys.answers_base;
        let Reservation { slot, status, decided_at, .. } = reserved.reservation;
        let kind = answer_kind(status);
        let value = format!("{kind}{}:{}:d", slot - base, decided_at - base);
        let ttl = (base - reserved.now).max(0) + answers_keep(request.max_delay);
        let mut pipe = redis::pipe();
        pipe.hset(&keys.answers, keys.answer_field.as_slice(), value).ignore();
        pipe.pexpire(&keys.answers, ttl).ignore();
        let _: () = pipe.query_async(&mut self.connection()).await?;
        Ok(())
    }

    /// Keeps a payload too large for a task until its dispatch (idempotent: a redelivery stores the
    /// same bytes again). Returns the reference the task carries.
    pub async fn put_payload(&self, of: MessageOf<'_>, payload: &[u8], ttl: Millis) -> Result<String, StoreError> {
        let reference = payload_key(&self.namespace, of.rule, of.key, of.message);
        let _: () = self.connection().pset_ex(&reference, payload, ttl.max(1) as u64).await?;
        Ok(reference)
    }

    /// Keeps a claim-checked payload at least `ttl` more (its task got a later slot).
    pub async fn keep_payload(&self, reference: &str, ttl: Millis) -> Result<(), StoreError> {
        let _: i64 =
            redis::cmd("PEXPIRE").arg(reference).arg(ttl.max(1)).arg("GT").query_async(&mut self.connection()).await?;
        Ok(())
    }

    /// The payload a task refers to, or `None` when it expired or never existed.
    pub async fn get_payload(&self, reference: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.connection().get(reference).await?)
    }

    async fn dispatch_op(&self, of: MessageOf<'_>, op: &str, ttl: Millis) -> Result<String, StoreError> {
        let marker = dispatch_key(&self.namespace, of.rule, of.key, of.message);
        let payload = payload_key(&self.namespace, of.rule, of.key, of.message);
        Ok(DISPATCH.key(marker).key(payload).arg(op).arg(ttl.max(1)).invoke_async(&mut self.connection()).await?)
    }

    /// Atomically takes the right to publish a task's message for `lease` (SET NX semantics).
    pub async fn claim_dispatch(&self, of: MessageOf<'_>, lease: Millis) -> Result<DispatchClaim, StoreError> {
        match self.dispatch_op(of, "claim", lease).await?.as_str() {
            "acquired" => Ok(DispatchClaim::Acquired),
            "busy" => Ok(DispatchClaim::Busy),
            "done" => Ok(DispatchClaim::Done),
            other => Err(StoreError::UnexpectedReply(other.to_owned())),
        }
    }

    /// Records the message as published and deletes its claim-checked payload.
    /// `memory`: how long the marker is kept (at least [`DISPATCHED_MEMORY`]; past the task's
    /// seal, so that a captured task can never publish again).
    pub async fn finish_dispatch(&self, of: MessageOf<'_>, memory: Millis) -> Result<(), StoreError> {
        self.dispatch_op(of, "done", memory.max(DISPATCHED_MEMORY)).await.map(drop)
    }

    /// Lets a retry publish at once after this attempt failed.
    pub async fn release_dispatch(&self, of: MessageOf<'_>) -> Result<(), StoreError> {
        self.dispatch_op(of, "release", 1).await.map(drop)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> SlotStore for RedisStore<C> {
    async fn reserve(&self, request: &SlotRequest<'_>) -> Result<Reserved, StoreError> {
        let reply: Vec<i64> = match self.reserve_call(request).cmd().query_async(&mut self.connection()).await {
            Err(error) if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let _: String = RESERVE.prepare_invoke().load_async(&mut self.connection()).await?;
                self.reserve_call(request).cmd().query_async(&mut self.connection()).await?
            }
            reply => reply?,
        };
        parse_reply(&reply)
    }

    async fn complete(&self, request: &SlotRequest<'_>, reserved: &Reserved) -> Result<(), StoreError> {
        self.mark_completed(request, reserved).await
    }

    async fn release(&self, request: &SlotRequest<'_>, _: &Reserved) -> Result<(), StoreError> {
        let keys = self.keys(request);
        let mut invocation = RELEASE.prepare_invoke();
        invocation.key(&keys.answers).arg(keys.answer_field.as_slice());
        let _: i64 = invocation.invoke_async(&mut self.connection()).await?;
        Ok(())
    }
}

/// One `EVALSHA reserve.lua` with its keys and arguments, for one request or a pipeline of them.
#[derive(Debug, Clone)]
pub struct ReserveCall {
    pub keys: EntityKeys,
    /// The hash of each budget the event draws from.
    pub budget_keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl ReserveCall {
    /// The command (EVALSHA: the script must have been loaded; `SCRIPT LOAD` it with [`reserve_script`]).
    pub fn cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(RESERVE.get_hash()).arg(3 + self.keys.sliding.len() + self.budget_keys.len());
        cmd.arg(&self.keys.state).arg(&self.keys.answers).arg(&self.keys.overrides);
        for key in self.keys.sliding.iter().chain(&self.budget_keys) {
            cmd.arg(key);
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }
}

/// How long an answers hash outlives max(its minute's start, the time of its last answer): the
/// minute itself, `max_delay`, and a margin for late redeliveries.
fn answers_keep(max_delay: Millis) -> Millis {
    ANSWER_BUCKET + max_delay + ANSWER_MARGIN
}

/// The source of `reserve.lua`, for `SCRIPT LOAD`.
pub fn reserve_script() -> &'static str {
    include_str!("../../../lua/reserve.lua")
}

/// Reads `reserve.lua`'s reply.
pub fn parse_reply(reply: &[i64]) -> Result<Reserved, StoreError> {
    let &[slot, late, replayed, now, decided_at, completed, busy] = reply else {
        return Err(StoreError::UnexpectedReply(format!("{reply:?}")));
    };
    let status = match late {
        0 => Status::Reserved,
        1 => Status::MaxDelayExceeded,
        2 => Status::CostExceedsLimit,
        _ => return Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    };
    let reservation =
        Reservation { slot, status, replayed: replayed == 1, decided_at, completed: completed == 1, busy: busy == 1 };
    Ok(Reserved { reservation, now })
}

impl<C> RedisStore<C> {
    /// The script call that reserves `request`'s slot.
    pub fn reserve_call(&self, request: &SlotRequest<'_>) -> ReserveCall {
        let keys = self.keys(request);
        let budget_limits = request.budgets.iter().flat_map(|b| &b.limits);
        let longest_window =
            request.limits.iter().chain(budget_limits).map(|l| l.per()).max().unwrap_or(0) + request.margin;
        // Each budget's fair share is one more fixed limit on the entity's own slots ('share').
        let shares: Vec<(usize, &Budget, &Limit)> = request
            .budgets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.max_share.is_some())
            .flat_map(|(i, b)| b.limits.iter().map(move |l| (i + 1, &**b, l)))
            .collect();
        let number = |n: i64| n.to_string().into_bytes();
        let mut args = vec![
            request.now.map(|now| now.to_string()).unwrap_or_default().into_bytes(),
            keys.answer_field.to_vec(),
            number(request.cost as i64),
            number(request.max_delay),
            number(keys.answers_base),
            number(answers_keep(request.max_delay)),
            number(request.lease),
            number(longest_window + STATE_MARGIN),
            number((request.limits.len() + shares.len()) as i64),
        ];
        let mut fields = vec![b"last".to_vec(), b"exp".to_vec(), b"ab".to_vec()];
        let mut parameters = Vec::new();
        let mut override_fields = Vec::new();
        let mut sliding_index = 3;
        for limit in request.limits {
            let id = state_id(limit);
            let overridden = override_id(limit);
            override_fields.extend([overridden.clone().into_bytes(), format!("{overridden}:u").into_bytes()]);
            let (extra, [a, b]) = match limit.window() {
                Window::Sliding => {
                    sliding_index += 1;
                    (sliding_index, [format!("{id}:b"), String::new()])
                }
                Window::Gcra { burst } => (burst as i64, [format!("{id}:t"), format!("{id}:r")]),
                Window::Fixed(_) => (0, [format!("{id}:w"), format!("{id}:u")]),
            };
            fields.extend([a.into_bytes(), b.into_bytes()]);
            parameters.extend([
                script_kind(limit).as_bytes().to_vec(),
                number(limit.per()),
                number(limit.limit() as i64),
                number(extra),
            ]);
        }
        for &(index, budget, limit) in &shares {
            let id = budget.share_id(limit);
            fields.extend([format!("{id}:w").into_bytes(), format!("{id}:u").into_bytes()]);
            parameters.extend([
                b"share".to_vec(),
                number(limit.per()),
                number(limit.limit() as i64),
                number(index as i64),
            ]);
            // Never set: a share has no override.
            override_fields.extend([id.clone().into_bytes(), format!("{id}:u").into_bytes()]);
        }
        args.extend(fields);
        args.extend(parameters);
        args.extend(override_fields);
        args.push(if request.reslot { b"reslot".to_vec() } else { Vec::new() });
        args.push(request.floor.map(|floor| floor.to_string().into_bytes()).unwrap_or_default());
        args.extend(adaptive_args(request.adaptive.as_ref(), request.limits));
        args.push(number(request.margin));
        args.push(number(request.budgets.len() as i64));
        let mut budget_keys = Vec::new();
        for budget in request.budgets {
            budget_keys.push(budget_key(&self.namespace, budget));
            args.push(number((3 + keys.sliding.len() + budget_keys.len()) as i64));
            args.extend(adaptive_args(budget.adaptive.as_ref(), &budget.limits));
            args.push(budget.max_share.map(|share| share.to_string().into_bytes()).unwrap_or_default());
            args.push(number(budget.limits.len() as i64));
            for limit in &budget.limits {
                // 'fixed' or 'spread': a budget takes fixed windows only.
                args.extend([
                    number(limit.per()),
                    number(limit.limit() as i64),
                    script_kind(limit).as_bytes().to_vec(),
                ]);
            }
        }
        ReserveCall { keys, budget_keys, args }
    }
}

/// An adaptive limit as reserve.lua reads it: ceiling, step, window ('' for none).
fn adaptive_args(adaptive: Option<&Adaptive>, limits: &[Limit]) -> [Vec<u8>; 3] {
    match adaptive {
        None => [Vec::new(), Vec::new(), Vec::new()],
        Some(a) => [a.ceiling(), a.step, adaptive_window(limits) as u64].map(|n| n.to_string().into_bytes()),
    }
}

/// How reserve.lua files a status in an answer: `R`eserved, `L`ate, or `C`ost over a limit in force.
fn answer_kind(status: Status) -> char {
    match status {
        Status::Reserved => 'R',
        Status::MaxDelayExceeded => 'L',
        Status::CostExceedsLimit => 'C',
    }
}

fn script_kind(limit: &Limit) -> &'static str {
    match limit.window() {
        Window::Fixed(Placement::Start) => "fixed",
        Window::Fixed(Placement::Spread) => "spread",
        Window::Sliding => "sliding",
        Window::Gcra { .. } => "gcra",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_script_knows_the_answers_minute() {
        let line = format!("local ANSWER_MINUTE = {}", super::ANSWER_BUCKET);
        assert!(super::reserve_script().contains(&line), "reserve.lua must say `{line}`");
    }
}
