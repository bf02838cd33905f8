//! Every Lua script drip-store runs, each built with `lua/prelude.lua` (the argument cursor, the
//! clock, the answer codec and the adaptive arithmetic they share) prepended.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// A script's source with the prelude before it (SCRIPT LOAD this; its SHA is the script's).
fn with_prelude(script: &str) -> String {
    format!("{PRELUDE}\n{script}")
}

pub(crate) static RESERVE_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_prelude(include_str!("../../../lua/reserve.lua")));
pub(crate) static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&RESERVE_SOURCE));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/release.lua"))));
pub(crate) static DISPATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/dispatch.lua"))));
pub(crate) static BUDGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/budget.lua"))));
pub(crate) static OVERRIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&with_prelude(include_str!("../../../lua/override.lua"))));
