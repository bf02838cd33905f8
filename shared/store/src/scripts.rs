//! Every Lua script drip-store runs, each a Redis function library (`Library`) built with
//! `lua/prelude.lua` (the argument cursor, the clock, the answer codec and the adaptive arithmetic
//! they share) prepended, and before it the numbers the scripts share with Rust, written from the
//! Rust constants (never copied by hand).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, ToRedisArgs};

use crate::args::{
    BUDGET_COLUMNS, BUDGET_HEAD, BUDGET_TAIL, EVENT_KEYS, EVENT_RECORD, LIMIT_RECORD, STATE_HEAD, STATE_TAIL,
};

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// The numbers the scripts and Rust share, by the name both use: the reply's (`reply.rs`) among
/// them, so that the script builds every reply from names Rust declares.
fn shared_numbers() -> Vec<(&'static str, i64)> {
    use drip_core::budgets as b;
    let mut numbers = vec![
        ("ANSWER_MINUTE", crate::keys::ANSWER_BUCKET),
        ("OVERRIDE_MARGIN", crate::keys::OVERRIDE_MARGIN),
        ("REPLY_LENGTH", crate::reply::REPLY_LENGTH as i64),
        ("LATENCY_FLOOR_US", b::LATENCY_FLOOR_US as i64),
        ("LATENCY_MAX_US", b::LATENCY_MAX_US as i64),
        ("LATENCY_MAX_CLIMB", b::LATENCY_MAX_CLIMB as i64),
        ("LATENCY_BUSY", b::LATENCY_BUSY as i64),
        ("LATENCY_HOLD_WINDOWS", b::LATENCY_HOLD_WINDOWS),
        ("LATENCY_MEMORY_WINDOWS", b::LATENCY_MEMORY_WINDOWS),
        ("EXPIRED_PARK", drip_core::schedule::EXPIRED_PARK),
        ("WAKE_LOST_AFTER", drip_core::schedule::WAKE_LOST_AFTER),
        ("MAX_WAKE_GAP", drip_core::schedule::MAX_WAKE_GAP),
        ("LEASE_TERM", drip_core::schedule::LEASE_TERM),
        ("FAIR_DEMAND_LIFE", drip_core::schedule::FAIR_DEMAND_LIFE),
    ];
    numbers.extend(crate::reply::reply_numbers());
    numbers
}

/// `local ANSWER_MINUTE, ... = 60000, ...`: one statement, the first of every script.
fn shared_numbers_line() -> String {
    let (names, values): (Vec<_>, Vec<_>) = shared_numbers().into_iter().map(|(n, v)| (n, v.to_string())).unzip();
    format!("local {} = {}", names.join(", "), values.join(", "))
}

/// A script's source with the shared numbers and the prelude before it.
fn with_prelude(script: &str) -> String {
    format!("{}\n{PRELUDE}\n{script}", shared_numbers_line())
}

/// `lua/reserve/`'s rooms, in the order they are assembled into one script: a Lua local is seen
/// only by what comes after it, so each room uses only the rooms before it. The model's files in
/// `drip-core`'s `schedule/` carry the same names, one concern each.
const RESERVE_ROOMS: [(&str, &str); 12] = [
    ("storage", include_str!("../../../lua/reserve/storage.lua")),
    ("request", include_str!("../../../lua/reserve/request.lua")),
    ("overrides", include_str!("../../../lua/reserve/overrides.lua")),
    ("entity", include_str!("../../../lua/reserve/entity.lua")),
    ("leases", include_str!("../../../lua/reserve/leases.lua")),
    ("calendars", include_str!("../../../lua/reserve/calendars.lua")),
    ("corrections", include_str!("../../../lua/reserve/corrections.lua")),
    ("search", include_str!("../../../lua/reserve/search.lua")),
    ("parking", include_str!("../../../lua/reserve/parking.lua")),
    ("decide", include_str!("../../../lua/reserve/decide.lua")),
    ("lean", include_str!("../../../lua/reserve/lean.lua")),
    ("call", include_str!("../../../lua/reserve/call.lua")),
];

/// The reservation script: its rooms, one after another.
fn reserve_script() -> String {
    RESERVE_ROOMS.iter().map(|(_, room)| *room).collect::<Vec<_>>().join("\n")
}

pub(crate) static RESERVE_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_prelude(&with_record_places(&reserve_script())));

/// A script of drip-store as a Redis function library (`FUNCTION LOAD` once, then `FCALL`): its
/// top level (the shared numbers, the prelude's functions, a script's own) runs once when the
/// library loads, where an `EVALSHA` of the same source makes every function again on each call
/// (for reserve.lua's ~60, more than its Redis calls cost: docs/capacity.md). Its one function,
/// `main`, is one call's work. Named after its source's hash, so instances of two versions during
/// a rolling deploy each call their own.
#[derive(Debug)]
pub(crate) struct Library {
    /// The library's one function, and the library itself.
    pub name: String,
    /// What `FUNCTION LOAD` takes.
    pub source: String,
}

impl Library {
    /// `body` defines `main` (reserve.lua does; `of_script` makes one around a script).
    fn new(kind: &str, body: &str) -> Self {
        use sha2::{Digest, Sha256};
        let hash: String = Sha256::digest(body.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect();
        let name = format!("drip_{kind}_{hash}");
        // Under EVAL the scripts read KEYS and ARGV as globals; a function is given them: locals
        // every function of the library sees, set at each call, with the prelude's cursor.
        let source = format!(
            "#!lua name={name}\nlocal KEYS, ARGV\n{body}\nredis.register_function('{name}', function(keys, args)\n  \
             KEYS, ARGV, arg_at = keys, args, 0\n  return main()\nend)\n"
        );
        Library { name, source }
    }

    /// A script whose whole text is one call's work, after `shared` (the prelude and helpers).
    fn of_script(kind: &str, shared: &str, script: &str) -> Self {
        Self::new(kind, &format!("{shared}\nlocal function main()\n{script}\nend"))
    }

    /// An `FCALL` of it: its keys, then its arguments.
    pub fn call(&self) -> FunctionCall<'_> {
        FunctionCall { library: self, keys: Vec::new(), args: Vec::new() }
    }

    /// Loads it (on every master of a Cluster); loading it again changes nothing.
    pub async fn load<C: ConnectionLike>(&self, connection: &mut C) -> redis::RedisResult<()> {
        let _: String =
            redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&self.source).query_async(connection).await?;
        Ok(())
    }

    /// Sends `command` (an `FCALL` of this library), loading the library first when Redis does not
    /// hold it (a new instance, a `FUNCTION FLUSH`).
    pub async fn run<C: ConnectionLike, T: FromRedisValue>(
        &self,
        command: &redis::Cmd,
        connection: &mut C,
    ) -> redis::RedisResult<T> {
        match command.query_async(connection).await {
            Err(error) if error.to_string().contains("Function not found") => {
                self.load(connection).await?;
                command.query_async(connection).await
            }
            reply => reply,
        }
    }
}

/// One `FCALL` being built ([`Library::call`]).
#[derive(Debug)]
pub(crate) struct FunctionCall<'a> {
    library: &'a Library,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl FunctionCall<'_> {
    pub fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    pub async fn invoke_async<C: ConnectionLike, T: FromRedisValue>(
        &self,
        connection: &mut C,
    ) -> redis::RedisResult<T> {
        let mut command = redis::cmd("FCALL");
        command.arg(&self.library.name).arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        self.library.run(&command, connection).await
    }
}

pub(crate) static RESERVE: LazyLock<Library> = LazyLock::new(|| Library::new("reserve", &RESERVE_SOURCE));

/// The script with each record place it names (`EVENT_COST`: the place of args.rs's `event.cost`
/// in the event's record; `EVENT_RECORD`: the record's length) written as its number. Numbers, not
/// Lua locals: every local a function captures costs each call of the script, and these are read
/// on every event.
fn with_record_places(script: &str) -> String {
    let mut places: Vec<(String, usize)> = Vec::new();
    let names = |record: &[(&'static str, &str)]| record.iter().map(|(name, _)| *name).collect::<Vec<_>>();
    let (state_head, state_tail) = (names(&STATE_HEAD), names(&STATE_TAIL));
    let (budget_head, budget_tail) = (names(&BUDGET_HEAD), names(&BUDGET_TAIL));
    for (record, fields) in [
        ("EVENT_RECORD", &EVENT_RECORD[..]),
        ("LIMIT_RECORD", &LIMIT_RECORD[..]),
        ("STATE_HEAD", &state_head[..]),
        ("STATE_TAIL", &state_tail[..]),
        ("BUDGET_HEAD", &budget_head[..]),
        ("BUDGET_COLUMNS", &BUDGET_COLUMNS[..]),
        ("BUDGET_TAIL", &budget_tail[..]),
    ] {
        places.push((record.to_owned(), fields.len()));
        places.extend(fields.iter().enumerate().map(|(at, name)| (name.replace('.', "_").to_uppercase(), at + 1)));
    }
    // The event's keys are offsets from its first (0 for the first).
    places.extend(EVENT_KEYS.iter().enumerate().map(|(at, name)| (name.replace('.', "_").to_uppercase(), at)));
    let mut words: Vec<(String, String)> = places.into_iter().map(|(name, place)| (name, place.to_string())).collect();
    words.extend(field_words());
    replace_words(script, words)
}

/// The hash fields the scripts write by name (`FIELD_POOL_RETURNS`), each as a Lua string.
fn field_words() -> impl Iterator<Item = (String, String)> {
    crate::keys::field::SCRIPT_FIELDS.iter().map(|(name, value)| (name.to_string(), format!("'{value}'")))
}

/// `script` with every name of `words` replaced by its value, longest first, so that no name is
/// replaced inside a longer one.
fn replace_words(script: &str, mut words: Vec<(String, String)>) -> String {
    words.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    words.into_iter().fold(script.to_owned(), |text, (name, value)| text.replace(&name, &value))
}

pub(crate) static RELEASE: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("release", &with_prelude(""), include_str!("../../../lua/release.lua")));
pub(crate) static DISPATCH: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("dispatch", &with_prelude(""), include_str!("../../../lua/dispatch.lua")));
pub(crate) static LEASE: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("lease", &with_prelude(""), include_str!("../../../lua/lease.lua")));
pub(crate) static RETURNS: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("returns", &with_prelude(""), include_str!("../../../lua/returns.lua")));
pub(crate) static WAKE: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("wake", &with_prelude(""), include_str!("../../../lua/wake.lua")));
pub(crate) static FAIR: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("fair", &with_prelude(""), include_str!("../../../lua/fair.lua")));
pub(crate) static BUDGET: LazyLock<Library> = LazyLock::new(|| {
    let script = replace_words(include_str!("../../../lua/budget.lua"), field_words().collect());
    Library::of_script("budget", &with_latency(), &script)
});
pub(crate) static OVERRIDE: LazyLock<Library> =
    LazyLock::new(|| Library::of_script("override", &with_latency(), include_str!("../../../lua/override.lua")));

/// What the scripts that take latency reports share: the prelude, then `lua/latency.lua`.
fn with_latency() -> String {
    with_prelude(include_str!("../../../lua/latency.lua"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shared number is defined once, by the generated line: no script spells its own.
    #[test]
    fn no_script_defines_a_shared_number_itself() {
        let rooms = RESERVE_ROOMS.map(|(_, room)| room);
        let sources = rooms.iter().copied().chain([
            PRELUDE,
            include_str!("../../../lua/latency.lua"),
            include_str!("../../../lua/override.lua"),
            include_str!("../../../lua/budget.lua"),
            include_str!("../../../lua/lease.lua"),
            include_str!("../../../lua/returns.lua"),
            include_str!("../../../lua/dispatch.lua"),
            include_str!("../../../lua/release.lua"),
            include_str!("../../../lua/wake.lua"),
            include_str!("../../../lua/fair.lua"),
        ]);
        let sources: Vec<&str> = sources.collect();
        for (name, _) in shared_numbers() {
            for source in &sources {
                let defines = source.lines().any(|line| {
                    let line = line.trim_start();
                    line.starts_with("local ") && line.split('=').next().is_some_and(|names| names.contains(name))
                });
                assert!(!defines, "a script defines {name} itself; it comes from shared_numbers()");
            }
            assert!(
                RESERVE_SOURCE.starts_with(&shared_numbers_line()),
                "the reservation script starts with the numbers"
            );
        }
    }

    /// The rooms write the state's and the budgets' fields through the names keys.rs declares:
    /// none spells a field of SCRIPT_FIELDS itself in its code.
    #[test]
    fn no_room_spells_a_field_the_store_declares() {
        for (room, text) in RESERVE_ROOMS {
            for line in text.lines() {
                let code = line.split("--").next().unwrap_or_default();
                for (name, value) in crate::keys::field::SCRIPT_FIELDS {
                    let quoted = format!("'{value}'");
                    // The queue's key ends in ':q' too, and 'R' is also STATUS.R (reserved).
                    let allowed = (room == "parking" && value == "q" && code.contains("KEYS[e.base + KEY_STATE]"))
                        || (value == "R" && room != "leases");
                    assert!(!code.contains(&quoted) || allowed, "{room} spells {quoted} (use {name}): {line}");
                }
            }
        }
        assert!(RESERVE_SOURCE.contains("local names, limits = {'f'}"), "the names are written in as strings");
    }

    /// The storage room is the reservation's only way to Redis: no other room calls it, so a
    /// change of layout (a field, a key, a structure) is made in one file.
    #[test]
    fn only_the_storage_room_calls_redis() {
        for (room, text) in RESERVE_ROOMS {
            let calls: Vec<&str> = text
                .lines()
                .filter(|line| {
                    let code = line.split("--").next().unwrap_or_default();
                    code.contains("redis.call") || code.contains("redis.pcall")
                })
                .collect();
            if room == "storage" {
                assert!(calls.len() > 10, "the storage room holds the calls");
            } else {
                assert!(calls.is_empty(), "{room} calls Redis itself: {calls:?}");
            }
        }
    }

    /// Every room of `lua/reserve/` is assembled, once, in the order of RESERVE_ROOMS: a room
    /// that uses a local of a later room would find nil there.
    #[test]
    fn every_room_of_the_reservation_script_is_assembled_once() {
        let on_disk: std::collections::BTreeSet<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/reserve"))
                .expect("lua/reserve")
                .map(|entry| entry.expect("a room").file_name().to_string_lossy().trim_end_matches(".lua").to_owned())
                .collect();
        let assembled: std::collections::BTreeSet<String> = RESERVE_ROOMS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(on_disk, assembled);
        assert_eq!(assembled.len(), RESERVE_ROOMS.len(), "no room twice");
        let mut defined = std::collections::HashMap::new();
        for (at, (room, text)) in RESERVE_ROOMS.iter().enumerate() {
            for line in text.lines().filter_map(|l| l.strip_prefix("local function ")) {
                defined.insert(line.split('(').next().unwrap_or_default().to_owned(), (at, *room));
            }
        }
        for (at, (room, text)) in RESERVE_ROOMS.iter().enumerate() {
            for (name, (defined_at, home)) in &defined {
                let calls = text.match_indices(&format!("{name}(")).any(|(i, _)| {
                    !text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.' || c == ':')
                        && !text[..i].ends_with("function ")
                });
                assert!(!calls || defined_at <= &at, "{room} calls {name} of {home}, a later room");
            }
        }
    }

    #[test]
    fn the_numbers_are_the_rust_constants() {
        let line = shared_numbers_line();
        assert!(line.contains("ANSWER_MINUTE") && line.contains(&crate::keys::ANSWER_BUCKET.to_string()), "{line}");
        let names = line.split(" = ").next().unwrap_or_default().split(", ").count();
        let values = line.split(" = ").nth(1).unwrap_or_default().split(", ").count();
        assert_eq!((names, values), (31, 31), "14 numbers and the reply's 17: {line}");
        assert!(line.contains("REPLY_LEASE_WANTED") && line.contains("CORRECTION_UNKNOWN"), "{line}");
    }

    /// The names a Lua table constructor starting at `text`'s first `{` sets (at its own level).
    fn constructor_names(text: &str) -> std::collections::BTreeSet<String> {
        let (mut names, mut depth, mut word) = (std::collections::BTreeSet::new(), 0, String::new());
        let mut chars = text[text.find('{').expect("a constructor")..].chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' | '(' => depth += 1,
                '}' | ')' => depth -= 1,
                '=' if depth == 1 && chars.peek() != Some(&'=') && !word.is_empty() => {
                    names.insert(std::mem::take(&mut word));
                }
                c if c.is_alphanumeric() || c == '_' => word.push(c),
                ' ' => {}
                _ => word.clear(),
            }
            if depth == 0 {
                break;
            }
        }
        names
    }

    /// `copy_read` builds an event's tables as `read_event` builds them, without parsing its
    /// record again: a field `read_event` sets that `copy_read` did not would be nil on every
    /// event written alike (a drain's heads, a group commit's events of a rule), and only a
    /// differential test that happened to need it would notice.
    #[test]
    fn copy_read_builds_every_field_read_event_does() {
        let text = include_str!("../../../lua/reserve/request.lua");
        let body = |name: &str| {
            let from = text.find(&format!("local function {name}(")).expect("the function");
            &text[from..from + text[from..].find("\nend\n").expect("its end")]
        };
        // Each table the two build (the event, its limits, its budgets and their limits), and the
        // name the fields set after its constructor go by (`e.state_from, e.state_to = ...`).
        let tables = [
            ("local e = {", "e."),
            ("limits[i] = {", ""),
            ("local budget = {", "budget."),
            ("budget_limits[j] = {", ""),
        ];
        let names = |body: &str, (table, after): (&str, &str)| {
            let mut names = constructor_names(&body[body.find(table).expect(table)..]);
            for line in body.lines().map(str::trim).filter(|l| !after.is_empty() && l.starts_with(after)) {
                let Some((left, _)) = line.split_once(" = ") else { continue };
                names.extend(left.split(',').filter_map(|target| target.trim().strip_prefix(after)).map(str::to_owned));
            }
            names
        };
        let (read, copied) = (body("read_event"), body("copy_read"));
        for table in tables {
            let (read_names, copied_names) = (names(read, table), names(copied, table));
            assert!(read_names.len() > 3, "{}: {read_names:?}", table.0);
            assert_eq!(read_names, copied_names, "{}: read_event's fields, then copy_read's", table.0);
        }
    }
}
