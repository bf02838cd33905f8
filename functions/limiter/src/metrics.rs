use std::sync::Arc;

use drip_service::metrics::{HistogramFamily, Metrics, seconds_histogram};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub rule: String,
    /// `forward`, `delay`, or the dead-letter reason.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

#[derive(Debug)]
pub struct LimiterMetrics {
    pub shared: Arc<Metrics>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub delay: HistogramFamily<RuleLabels>,
}

impl LimiterMetrics {
    pub fn new(mut metrics: Metrics) -> Self {
        let decisions = Family::<DecisionLabels, Counter>::default();
        let delay: HistogramFamily<RuleLabels> = Family::new_with_constructor(seconds_histogram);
        metrics.registry.register(
            "decisions",
            "Events by rule and outcome (forward, delay or the dead-letter reason)",
            decisions.clone(),
        );
        metrics.registry.register("delay_seconds", "How far after its decision an event's slot lies", delay.clone());
        Self { shared: Arc::new(metrics), decisions, delay }
    }

    pub fn decided(&self, rule: &str, outcome: &str) {
        self.decisions.get_or_create(&DecisionLabels { rule: rule.to_owned(), outcome: outcome.to_owned() }).inc();
    }
}
