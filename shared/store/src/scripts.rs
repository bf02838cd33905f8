//! Every Lua script drip-store runs, each built with `lua/prelude.lua` (the argument cursor, the
//! clock, the answer codec and the adaptive arithmetic they share) prepended, and before it the
//! numbers the scripts share with Rust, written from the Rust constants (never copied by hand).

use std::sync::LazyLock;

use redis::Script;

use crate::args::{EVENT_RECORD, LIMIT_RECORD};

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// How many numbers `reserve.lua` replies per event.
pub(crate) const REPLY_LENGTH: usize = 5;

/// The numbers the scripts and Rust share, by the name both use.
fn shared_numbers() -> [(&'static str, i64); 8] {
    use drip_core::budgets as b;
    [
        ("ANSWER_MINUTE", crate::keys::ANSWER_BUCKET),
        ("OVERRIDE_MARGIN", crate::keys::OVERRIDE_MARGIN),
        ("REPLY_LENGTH", REPLY_LENGTH as i64),
        ("LATENCY_FLOOR_US", b::LATENCY_FLOOR_US as i64),
        ("LATENCY_MAX_US", b::LATENCY_MAX_US as i64),
        ("LATENCY_MAX_CLIMB", b::LATENCY_MAX_CLIMB as i64),
        ("LATENCY_HOLD_WINDOWS", b::LATENCY_HOLD_WINDOWS),
        ("LATENCY_MEMORY_WINDOWS", b::LATENCY_MEMORY_WINDOWS),
    ]
}

/// `local ANSWER_MINUTE, ... = 60000, ...`: one statement, the first of every script.
fn shared_numbers_line() -> String {
    let (names, values): (Vec<_>, Vec<_>) = shared_numbers().into_iter().map(|(n, v)| (n, v.to_string())).unzip();
    format!("local {} = {}", names.join(", "), values.join(", "))
}

/// A script's source with the shared numbers and the prelude before it (SCRIPT LOAD this; its SHA
/// is the script's).
fn with_prelude(script: &str) -> String {
    format!("{}\n{PRELUDE}\n{script}", shared_numbers_line())
}

pub(crate) static RESERVE_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_prelude(&with_record_places(include_str!("../../../lua/reserve.lua"))));

/// `reserve.lua` as a Redis function library (`FUNCTION LOAD`, then `FCALL`): its top level (the
/// prelude, ~60 functions, the constant tables) runs once when the library loads instead of on every
/// call, which an `EVALSHA` of the same source pays each time (~3.5 µs of closures a call, measured
/// with 60 empty functions). Named after its source's hash, so instances of two versions during a
/// rolling deploy each call their own.
#[derive(Debug)]
pub(crate) struct Library {
    /// The library's one function, and the library itself.
    pub name: String,
    /// What `FUNCTION LOAD` takes.
    pub source: String,
}

pub(crate) static RESERVE: LazyLock<Library> = LazyLock::new(|| {
    use sha2::{Digest, Sha256};
    let hash: String = Sha256::digest(RESERVE_SOURCE.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect();
    let name = format!("drip_reserve_{hash}");
    // The script reads KEYS and ARGV (globals under EVAL); a function is given them: locals that
    // every function of the library sees, set at each call.
    let source = format!(
        "#!lua name={name}\nlocal KEYS, ARGV\n{}\nredis.register_function('{name}', function(keys, args)\n  \
         KEYS, ARGV = keys, args\n  return main()\nend)\n",
        *RESERVE_SOURCE
    );
    Library { name, source }
});

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shared number is defined once, by the generated line: no script spells its own.
    #[test]
    fn no_script_defines_a_shared_number_itself() {
        let sources = [
            PRELUDE,
            include_str!("../../../lua/reserve.lua"),
            include_str!("../../../lua/latency.lua"),
            include_str!("../../../lua/override.lua"),
            include_str!("../../../lua/budget.lua"),
            include_str!("../../../lua/lease.lua"),
            include_str!("../../../lua/dispatch.lua"),
            include_str!("../../../lua/release.lua"),
        ];
        for (name, _) in shared_numbers() {
            for source in sources {
                let defines = source.lines().any(|line| {
                    let line = line.trim_start();
                    line.starts_with("local ") && line.split('=').next().is_some_and(|names| names.contains(name))
                });
                assert!(!defines, "a script defines {name} itself; it comes from shared_numbers()");
            }
            assert!(RESERVE_SOURCE.starts_with(&shared_numbers_line()), "reserve.lua's source starts with the numbers");
        }
    }

    #[test]
    fn the_numbers_are_the_rust_constants() {
        let line = shared_numbers_line();
        assert!(line.contains("ANSWER_MINUTE") && line.contains(&crate::keys::ANSWER_BUCKET.to_string()), "{line}");
        let names = line.split(" = ").next().unwrap_or_default().split(", ").count();
        let values = line.split(" = ").nth(1).unwrap_or_default().split(", ").count();
        assert_eq!((names, values), (8, 8), "{line}");
    }
}
