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
    LazyLock::new(|| with_prelude(&format!("{}\n{}", record_places(), include_str!("../../../lua/reserve.lua"))));

/// Lua constants for each field's place in the argument records args.rs writes (`event.cost` is
/// `EVENT_COST`), and each record's length (`EVENT_RECORD`): the script reads by these names.
fn record_places() -> String {
    let mut lua = String::from("-- Generated from drip-store's args.rs: each field's place in its record.\n");
    for (record, fields) in [("EVENT_RECORD", &EVENT_RECORD[..]), ("LIMIT_RECORD", &LIMIT_RECORD[..])] {
        lua.push_str(&format!("local {record} = {}\n", fields.len()));
        for (place, name) in fields.iter().enumerate() {
            lua.push_str(&format!("local {} = {}\n", name.replace('.', "_").to_uppercase(), place + 1));
        }
    }
    lua
}
pub(crate) static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&RESERVE_SOURCE));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/release.lua"))));
pub(crate) static DISPATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/dispatch.lua"))));
pub(crate) static BUDGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/budget.lua"))));
pub(crate) static OVERRIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/override.lua"))));
