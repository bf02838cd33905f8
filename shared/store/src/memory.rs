use std::sync::Mutex;
use std::time::SystemTime;

use drip_core::schedule::{ReserveRequest, Scheduler};
use drip_core::time::system_time_to_millis;

use crate::{Reserved, SlotRequest, SlotStore, StoreError};

/// The reference model behind a lock: one process, no persistence.
#[derive(Debug, Default)]
pub struct MemoryStore {
    scheduler: Mutex<Scheduler>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl SlotStore for MemoryStore {
    async fn reserve(&self, request: &SlotRequest<'_>) -> Result<Reserved, StoreError> {
        let now = request.now.unwrap_or_else(|| system_time_to_millis(SystemTime::now()).unwrap_or(0));
        let model_request = ReserveRequest {
            message_id: request.message_id,
            cost: request.cost,
            limits: request.limits,
            max_delay: request.max_delay,
            now,
            lease: request.lease,
        };
        let reservation = self.with(|s| s.reserve(request.rule, request.key, &model_request));
        Ok(Reserved { reservation, now })
    }

    async fn complete(&self, request: &SlotRequest<'_>, _: &Reserved) -> Result<(), StoreError> {
        self.with(|s| s.complete(request.rule, request.key, request.message_id));
        Ok(())
    }

    async fn release(&self, request: &SlotRequest<'_>, _: &Reserved) -> Result<(), StoreError> {
        self.with(|s| s.release(request.rule, request.key, request.message_id));
        Ok(())
    }
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        f(&mut self.scheduler.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}
