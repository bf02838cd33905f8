//! Costs known only after the call (tokens of a model API, pages of a KYC report): the target's
//! `X-Drip-Cost` answer header, read by the limiter (a `forward: { url }`) and the dispatcher (an
//! `overflow: { url }`), or `POST /v1/feedback` with the message and its cost, correct what the
//! event booked, once per message (`Scheduler::correct`).

use drip_core::schedule::Correction;
use drip_store::{SlotRequest, Store, StoreError};

use crate::metrics::ServiceMetrics;

/// Corrects what `request`'s message booked with `actual`, counts it, and says what it did.
pub async fn correct(
    store: &dyn Store,
    metrics: &ServiceMetrics,
    rule: &str,
    request: &SlotRequest<'_>,
    actual: u64,
) -> Result<Correction, StoreError> {
    let correction = store.correct_cost(request, actual).await?;
    let outcome = match correction {
        Correction::Applied { booked, actual } if actual > booked => "more",
        Correction::Applied { booked, actual } if actual < booked => "less",
        Correction::Applied { .. } => "same",
        Correction::Already => "already",
        Correction::Unknown => "unknown",
    };
    metrics.shared.cost_corrected(rule, outcome);
    tracing::debug!(rule, key = request.key, actual, ?correction, "cost reported after the call");
    Ok(correction)
}
