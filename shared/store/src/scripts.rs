//! Every Lua script drip-store runs, each built with `lua/prelude.lua` (the argument cursor, the
//! clock, the answer codec and the adaptive arithmetic they share) prepended.

use std::sync::LazyLock;

use redis::Script;

use crate::args::{EVENT_RECORD, LIMIT_RECORD};

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// A script's source with the prelude before it (SCRIPT LOAD this; its SHA is the script's).
fn with_prelude(script: &str) -> String {
    format!("{PRELUDE}\n{script}")
}

pub(crate) static RESERVE_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_prelude(&with_record_places(include_str!("../../../lua/reserve.lua"))));

/// The script with each record place it names (`EVENT_COST`: the place of args.rs's `event.cost`
/// in the event's record; `EVENT_RECORD`: the record's length) written as its number. Numbers, not
/// Lua locals: every local a function captures costs each call of the script, and these are read
/// on every event.
fn with_record_places(script: &str) -> String {
    let mut places: Vec<(String, usize)> = Vec::new();
    for (record, fields) in [("EVENT_RECORD", &EVENT_RECORD[..]), ("LIMIT_RECORD", &LIMIT_RECORD[..])] {
        places.push((record.to_owned(), fields.len()));
        places.extend(fields.iter().enumerate().map(|(at, name)| (name.replace('.', "_").to_uppercase(), at + 1)));
    }
    // Longest first, so that no name is replaced inside a longer one.
    places.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    places.into_iter().fold(script.to_owned(), |text, (name, place)| text.replace(&name, &place.to_string()))
}

pub(crate) static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&RESERVE_SOURCE));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/release.lua"))));
pub(crate) static DISPATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/dispatch.lua"))));
pub(crate) static LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/lease.lua"))));
pub(crate) static BUDGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_latency(include_str!("../../../lua/budget.lua"))));
pub(crate) static OVERRIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_latency(include_str!("../../../lua/override.lua"))));

/// A script that takes latency reports: the prelude, then `lua/latency.lua`, then it.
fn with_latency(script: &str) -> String {
    with_prelude(&format!("{}\n{script}", include_str!("../../../lua/latency.lua")))
}
