//! What `drip simulate` decided for each event: the contract of its output, read by the summary
//! and the chart (a module of its own, so neither depends on the simulator).

use drip_core::time::Millis;
use serde::Serialize;

/// One line of output, the contract of `drip simulate`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub id: String,
    pub rule: Option<String>,
    pub key: Option<String>,
    pub decision: &'static str,
    pub scheduled_for: Option<String>,
    pub reason: Option<&'static str>,
    /// The rule is `mode: shadow`: `decision` is what enforcing would do; the event is forwarded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    #[serde(skip)]
    pub scheduled: Option<Scheduled>,
}

/// What a reservation consumed, for the summary and the chart (redeliveries consume nothing).
#[derive(Debug, Clone, Copy)]
pub struct Scheduled {
    pub slot: Millis,
    pub cost: u64,
}
