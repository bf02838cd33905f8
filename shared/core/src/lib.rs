//! Drip's pure core: the rules contract, key and cost templates, routing of an event to a rule, and
//! the reference model of slot reservation. Nothing here does I/O or reads the clock.

pub mod api_error;
pub mod attributes;
pub mod budgets;
pub mod delivery;
pub mod event;
pub mod fair;
pub mod json_path;
pub mod ledger;
pub mod limit;
pub mod outcome;
pub mod overflow;
pub mod partner;
pub mod routing;
pub mod rules;
pub mod rules_diff;
pub mod schedule;
pub mod template;
pub mod time;

/// `1 event`, `3 events`: a count and its noun, as every message Drip prints says it.
pub fn counted(count: u64, noun: &str) -> String {
    if count == 1 { format!("1 {noun}") } else { format!("{count} {noun}s") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::counted(1, "event"), "1 event");
        assert_eq!(super::counted(0, "event"), "0 events");
        assert_eq!(super::counted(12, "dead letter"), "12 dead letters");
    }
}
