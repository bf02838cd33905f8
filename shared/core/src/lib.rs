//! Drip's pure core: the rules contract, key and cost templates, routing of an event to a rule, and
//! the reference model of slot reservation. Nothing here does I/O or reads the clock.

pub mod attributes;
pub mod budgets;
pub mod delivery;
pub mod event;
pub mod json_path;
pub mod ledger;
pub mod limit;
pub mod outcome;
pub mod overflow;
pub mod routing;
pub mod rules;
pub mod rules_diff;
pub mod schedule;
pub mod template;
pub mod time;
