//! Where reservations live: Redis in production (`reserve.lua`, atomic across every instance, one
//! call for each group of reservations that arrive together), or memory (the reference model) for the simulator and tests.

mod answers;
pub mod args;
mod audit_text;
mod budgets;
mod busiest;
mod connection;
mod group_commit;
pub mod inspect;
mod keys;
mod memory;
mod overrides;
mod redis_ops;
mod redis_store;
mod reply;
mod request;
mod resume;
mod scripts;
mod store;

pub use answers::ANSWERS_KEPT;
pub use budgets::Calendar;
pub use busiest::{BusyKey, BusyKeys};
pub use connection::{
    AnyConnection, CallObserver, ConnectError, Observed, RedisSettings, TokenAuth, TokenFuture, TokenSource,
};
pub use group_commit::Batching;
pub use keys::{
    ANSWER_BUCKET, ANSWER_MARGIN, DISPATCHED_MEMORY, EntityKeys, OVERRIDE_MARGIN, RuleRef, STATE_MARGIN, budget_key,
    class_calendar_key, dispatch_key, field,
};
pub use memory::MemoryStore;
pub use overrides::{
    AuditEntry, Author, CostChange, FeedbackChange, OverrideChange, OverrideView, PauseChange, ResumeChange,
};
pub use redis_store::{
    DispatchClaim, LeaseObserver, MessageOf, RedisStore, ReserveCall, parse_replies, reserve_library,
};
pub use reply::Reply;
pub use request::{Clock, MAX_BODY_KEPT_IN_CALL, ParkedBody, Reserved, SlotRequest, StoreError, StoreFuture};
pub use resume::{MAX_OPERATOR_PAUSE, Paused, Resumed, pause, resume};
pub use store::{LEARNED_BY, Ping, Store, inspect_key, with_provenance};
