//! Redis key names, known nowhere outside this crate. Every key of one entity shares the hash tag
//! `{rule|key}`, so one script call touches one cluster slot (Memorystore for Redis Cluster runs
//! it unchanged). A rule that draws from a shared budget keeps its entities under the budget's tag
//! instead (`{b:<tag>}`), with the budget: one group of budgets, one slot (docs/rules.md: "Shared budgets").

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use drip_core::budgets::{Budget, FairRing, Leases};
use drip_core::fair::Member;
use drip_core::rules::{Classes, Limit, Rule, Window};
use drip_core::schedule::state_id;
use drip_core::time::{DAY, HOUR, MINUTE, Millis};
use sha2::{Digest, Sha256};

/// How long a message's answer outlives `max_delay`, for redeliveries that come late.
pub const ANSWER_MARGIN: Millis = HOUR;
/// How long an entity's state outlives its last slot plus its longest window.
pub const STATE_MARGIN: Millis = MINUTE;
/// How long overrides outlive the latest `until` among them (the scripts' OVERRIDE_MARGIN).
pub const OVERRIDE_MARGIN: Millis = DAY;
/// How long the dispatcher remembers a published task (Cloud Tasks rarely runs one twice, soon).
pub const DISPATCHED_MEMORY: Millis = DAY;

/// Answers are kept in one small hash per entity and minute of publication, which expires as a
/// whole: a field costs ~30 bytes where a key of its own costs ~190.
pub const ANSWER_BUCKET: Millis = drip_core::schedule::ANSWER_MINUTE;

/// A rule as its entities' keys name it: its id, the hash tag of its budgets if it has any (and
/// their leases, which spread its keys over partitions), and whether its entities are classes'
/// (`<key>#<class>`, each key's classes on one slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleRef<'a> {
    pub id: &'a str,
    pub tag: Option<&'a str>,
    pub leases: Option<Leases>,
    pub classed: bool,
}

impl<'a> RuleRef<'a> {
    /// The rule, its entities classes' when it has classes (for what names no entity: its
    /// overrides, its keys' pattern).
    pub fn of(rule: &'a Rule) -> Self {
        let leases = rule.budgets.iter().find_map(|b| b.leases);
        Self { id: &rule.id, tag: rule.budget_tag(), leases, classed: rule.classes.is_some() }
    }

    /// The rule as the keys of its entity `key` name it: a class's entity `<key>#<class>` (its
    /// suffix one of the rule's classes) is its key's; any other entity of a rule with classes (a
    /// bare key that parked or booked before the rule had them) is its own, a `#` in it included.
    pub fn of_entity(rule: &'a Rule, key: &str) -> Self {
        Self { classed: rule.scope_of(key) != key, ..Self::of(rule) }
    }

    /// A rule that draws from no budget and has no classes.
    pub fn plain(id: &'a str) -> Self {
        Self { id, tag: None, leases: None, classed: false }
    }

    /// The key an entity belongs to: a class's entity `<key>#<class>` is its key's, any other its own.
    pub fn scope<'k>(&self, key: &'k str) -> &'k str {
        self.classed.then(|| Classes::split(key)).flatten().map_or(key, |(scope, _)| scope)
    }

    /// The hash tag of the budgets' group for the entity `key` (a class's entity `<key>#<class>`
    /// counts as its key): the group's, or with leases, its key's partition's.
    fn group_tag(&self, key: &str) -> Option<String> {
        self.scope_tag(self.scope(key))
    }

    /// The same for a key's `scope` (what [`RuleRef::scope`] gave, never split again).
    fn scope_tag(&self, scope: &str) -> Option<String> {
        let tag = self.tag?;
        Some(budgets_tag(tag, self.leases.map(|leases| (leases, leases.partition_of(scope)))))
    }

    /// `<namespace>:{...}`: the start of every Redis key of the entity `key`: under the budgets'
    /// tag, or the entity's own; a class's entity `<key>#<class>` shares its key's tag.
    fn prefix(&self, namespace: &str, key: &str) -> String {
        match (self.group_tag(key), self.classed.then(|| Classes::split(key)).flatten()) {
            (Some(tag), _) => format!("{namespace}:{{{tag}}}:{}|{}", self.id, escape(key)),
            (None, Some((key, class))) => format!("{}#{}", entity_prefix(namespace, self.id, key), escape(class)),
            (None, None) => entity_prefix(namespace, self.id, key),
        }
    }
}

/// The calendar a classed rule's `key` shares among its classes (`Classes::calendar`), on the
/// slot of the key's entities.
pub fn class_calendar_key(namespace: &str, rule: RuleRef<'_>, key: &str) -> String {
    match rule.scope_tag(key) {
        Some(tag) => format!("{namespace}:{{{tag}}}:classes:{}|{}", rule.id, escape(key)),
        None => format!("{}:classes", entity_prefix(namespace, rule.id, key)),
    }
}

/// The hash tag of partition `partition` of a leased budget group `tag`: `b:<tag>|p<partition>~<n>`,
/// with the smallest `n` that puts its cluster slot in the partition's share of the slot range
/// (the `partition`-th of `partitions` equal parts). A cluster assigns its masters contiguous,
/// equal ranges of slots, so the partitions spread evenly over them instead of by chance.
pub fn partition_tag(tag: &str, partitions: u32, partition: u32) -> String {
    /// By (group tag, partitions, partition): found once per process.
    type Tags = Mutex<HashMap<(String, u32, u32), String>>;
    static TAGS: OnceLock<Tags> = OnceLock::new();
    let tags = TAGS.get_or_init(Default::default);
    let id = (tag.to_owned(), partitions, partition);
    if let Some(found) = tags.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return found.clone();
    }
    let (from, to) = slot_share(partitions, partition);
    let found = (0u32..)
        .map(|n| format!("b:{tag}|p{partition}~{n}"))
        .find(|name| (from..to).contains(&slot(name)))
        .expect("some suffix lands in every share");
    tags.lock().unwrap_or_else(|e| e.into_inner()).insert(id, found.clone());
    found
}

/// Redis Cluster's 16,384 slots split in `parts` equal shares: the `part`-th, as a range.
fn slot_share(parts: u32, part: u32) -> (u16, u16) {
    let bound = |i: u32| (u64::from(i) * 16_384 / u64::from(parts.max(1))) as u16;
    (bound(part), if part + 1 >= parts { 16_384 } else { bound(part + 1) })
}

/// The cluster slot of a hash tag's keys.
fn slot(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16_384
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityKeys {
    pub state: String,
    /// The answers hash of the message's minute of publication.
    pub answers: String,
    /// The start of that minute: answers' times are kept relative to it.
    pub answers_base: Millis,
    /// The message's field in it: 8 bytes of the SHA-256 of its identity.
    pub answer_field: [u8; 8],
    /// Where earlier versions kept the entity's overrides, pause and adaptive level (a hash of
    /// their own): folded into the state hash's overrides field by the first script that meets it.
    pub legacy_overrides: String,
    /// One sorted set per sliding limit, in the order of the rule's limits.
    pub sliding: Vec<String>,
}

impl EntityKeys {
    /// `message` is the message's identity (`MessageRef::identity`), `published` the time its
    /// answers are filed under (its publish time: the same on every redelivery). An undated
    /// message (not from Pub/Sub) is filed in the entity's undated answers (`a:u`, base 0), which
    /// live as long as undated messages keep coming, plus a minute, max_delay and a margin.
    pub fn new(
        namespace: &str,
        rule: RuleRef<'_>,
        key: &str,
        message: &str,
        published: Option<Millis>,
        limits: &[Limit],
    ) -> Self {
        let prefix = rule.prefix(namespace, key);
        let (answers, answers_base) = answers_file(&prefix, published.map(|at| at.div_euclid(ANSWER_BUCKET)));
        let digest = Sha256::digest(message.as_bytes());
        let mut answer_field = [0u8; 8];
        answer_field.copy_from_slice(&digest[..8]);
        Self {
            state: format!("{prefix}:state"),
            answers,
            answers_base,
            answer_field,
            legacy_overrides: format!("{prefix}:o"),
            sliding: limits
                .iter()
                .filter(|l| l.window() == Window::Sliding)
                .map(|l| format!("{prefix}:{}", state_id(l)))
                .collect(),
        }
    }
}

impl EntityKeys {
    /// The keys of the entity itself (its state, legacy overrides, sliding sets), for what reads or
    /// writes the entity and no message's answer: inspect, overrides, pauses, parking. Their
    /// answer fields name the undated answers of no message and are never used.
    pub fn of_entity(namespace: &str, rule: RuleRef<'_>, key: &str, limits: &[Limit]) -> Self {
        Self::new(namespace, rule, key, "", None, limits)
    }

    /// The entity's answers hash of publication minute `minute` (`None`: the undated answers),
    /// and the base its times are relative to.
    pub fn answers_of(&self, minute: Option<Millis>) -> (String, Millis) {
        answers_file(self.state.strip_suffix(":state").unwrap_or(&self.state), minute)
    }
}

impl EntityKeys {
    fn prefix(&self) -> &str {
        self.state.strip_suffix(":state").unwrap_or(&self.state)
    }

    /// The entity's queue of parked messages (reserve.lua's `queue_key`), and the list of those a
    /// drain took and is handing over.
    pub fn parked_queue(&self) -> String {
        format!("{}:q", self.prefix())
    }

    pub fn handing_list(&self) -> String {
        format!("{}:h", self.prefix())
    }

    /// The message's name in them: its answers hash, a newline, its answer field.
    pub fn parked_entry(&self) -> Vec<u8> {
        [self.answers.as_bytes(), b"\n", &self.answer_field].concat()
    }

    /// Where the message's body is kept when its entry is its name alone (`EntryBody::At`).
    pub fn parked_body_key(&self) -> Vec<u8> {
        match EntryBody::of(&self.parked_entry()) {
            Some(EntryBody::At(key)) => key,
            _ => unreachable!("a message's name is an entry whose body is beside it"),
        }
    }

    /// The message's entry when it keeps its `body` (parked by a call that carried it):
    /// `\0<length of its name>\n<name><body>`.
    pub fn parked_entry_with(&self, body: &[u8]) -> Vec<u8> {
        let name = self.parked_entry();
        [format!("\0{}\n", name.len()).as_bytes(), &name, body].concat()
    }
}

/// Where the body of a queue entry's message is (reserve.lua's `park`).
#[derive(Debug, PartialEq, Eq)]
pub enum EntryBody<'a> {
    /// In the entry itself: `\0<length of its name>\n<name><body>` (`parked_entry_with`).
    Kept(&'a [u8]),
    /// Beside it, in a key of its own (`Store::park_body`; the only kind an older Drip wrote):
    /// `<answers hash>:q:<field>` for the entry `<answers hash>\n<field>`.
    At(Vec<u8>),
}

impl<'a> EntryBody<'a> {
    /// The body of a queue `entry`, or `None` for an entry Drip does not write.
    pub fn of(entry: &'a [u8]) -> Option<Self> {
        if let Some(rest) = entry.strip_prefix(b"\0") {
            let newline = rest.iter().position(|&b| b == b'\n')?;
            let length: usize = std::str::from_utf8(&rest[..newline]).ok()?.parse().ok()?;
            return rest.get(newline + 1 + length..).map(Self::Kept);
        }
        let (answers, field) = entry.split_at_checked(entry.len().checked_sub(9)?)?;
        let field = field.strip_prefix(b"\n")?;
        Some(Self::At([answers, b":q:", field].concat()))
    }
}

/// The answers hash of an entity (`prefix`) for one publication minute, or its undated answers
/// (`a:u`, base 0), and the base its times are relative to.
fn answers_file(prefix: &str, minute: Option<Millis>) -> (String, Millis) {
    match minute {
        Some(minute) => (format!("{prefix}:a:{minute}"), minute * ANSWER_BUCKET),
        None => (format!("{prefix}:a:u"), 0),
    }
}

/// A shared budget's hash (its calendar, pause and adaptive level), under its group's tag; for a
/// leased budget, its home (what it leased of each window, to which partition).
pub fn budget_key(namespace: &str, budget: &Budget) -> String {
    format!("{namespace}:{{b:{}}}:budget:{}", budget.tag, budget.name)
}

/// The hash tag of a budgets group `tag`'s keys: the group's, or on leased budgets the given
/// partition's.
fn budgets_tag(tag: &str, partition: Option<(Leases, u32)>) -> String {
    match partition {
        None => format!("b:{tag}"),
        Some((leases, partition)) => partition_tag(tag, leases.partitions, partition),
    }
}

/// A fair budget's ring of waiting keys (`lua/fair.lua`), and the hash of its drain (where the
/// next starts, its wake): on the budget's slot, with every entity that draws from it; on a leased
/// budget, a partition's ring on the partition's slot, with its entities.
pub fn fair_keys(namespace: &str, ring: FairRing<'_>) -> [String; 2] {
    let budget = ring.budget;
    let tag = budgets_tag(&budget.tag, budget.leases.zip(ring.partition));
    let ring = format!("{namespace}:{{{tag}}}:fair:{}", budget.name);
    let drain = format!("{ring}:m");
    [ring, drain]
}

/// A fair ring's member as the ring holds it: `<rule id>\n<key>` (a rule id has no newline).
pub fn ring_member(member: &Member) -> String {
    format!("{}\n{}", member.rule, member.key)
}

/// The member a ring entry names.
pub fn member_of(entry: &str) -> Option<Member> {
    let (rule, key) = entry.split_once('\n')?;
    Some(Member { rule: rule.to_owned(), key: key.to_owned() })
}

/// A leased budget's pool in one partition (what it was leased and booked of each window), on the
/// slot of the partition's entities.
pub fn pool_key(namespace: &str, budget: &Budget, partition: u32) -> String {
    let partitions = budget.leases.map_or(1, |l| l.partitions);
    format!("{namespace}:{{{}}}:budget:{}", partition_tag(&budget.tag, partitions, partition), budget.name)
}

/// A claim-checked payload: `<prefix>:p:<message identity>`.
pub fn payload_key(namespace: &str, rule: &str, key: &str, message: &str) -> String {
    format!("{}:p:{message}", entity_prefix(namespace, rule, key))
}

/// The dispatcher's once-only marker: `<prefix>:d:<message identity>`.
pub fn dispatch_key(namespace: &str, rule: &str, key: &str, message: &str) -> String {
    format!("{}:d:{message}", entity_prefix(namespace, rule, key))
}

/// The keys of a rule's entities that have overrides (a set, for `drip limits list`; on a cluster it
/// lives on the rule's own slot, so it is kept up to date apart from the overrides themselves).
pub fn overridden_keys(namespace: &str, rule: &str) -> String {
    format!("{namespace}:{{{rule}}}:overridden")
}

/// The rule's audit list of override changes, newest first.
pub fn overrides_log(namespace: &str, rule: &str) -> String {
    format!("{namespace}:{{{rule}}}:overrides-log")
}

/// A secret every instance shares (`Store::shared_secret`).
pub fn secret_key(namespace: &str, name: &str) -> String {
    format!("{namespace}:secret:{name}")
}

/// `<namespace>:{rule|key}`: the start of every Redis key of one entity.
fn entity_prefix(namespace: &str, rule: &str, key: &str) -> String {
    format!("{namespace}:{{{rule}|{}}}", escape(key))
}

/// Entity keys come from payloads: braces would move the hash tag, so they (and `%`) are escaped.
fn escape(key: &str) -> String {
    if !key.contains(['%', '{', '}']) {
        return key.to_owned();
    }
    key.replace('%', "%25").replace('{', "%7B").replace('}', "%7D")
}

/// The key [`escape`] wrote.
pub(crate) fn unescape(key: &str) -> String {
    key.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")
}

#[cfg(test)]
mod tests {
    use drip_core::rules::{Limit, Placement, Window};

    use super::*;

    #[test]
    fn every_key_shares_one_hash_tag_even_for_hostile_keys() {
        let limits = [
            Limit::new(1, 1_000, Window::Fixed(Placement::Start)).unwrap(),
            Limit::new(1, 60_000, Window::Sliding).unwrap(),
        ];
        let keys = EntityKeys::new("drip", RuleRef::plain("payouts"), "a}b{c%", "m1", Some(125_000), &limits);
        assert_eq!(keys.state, "drip:{payouts|a%7Db%7Bc%25}:state");
        assert_eq!((keys.answers.as_str(), keys.answers_base), ("drip:{payouts|a%7Db%7Bc%25}:a:2", 120_000));
        assert_ne!(
            keys.answer_field,
            EntityKeys::new("drip", RuleRef::plain("payouts"), "k", "m2", Some(0), &limits).answer_field
        );
        assert_eq!(keys.sliding, ["drip:{payouts|a%7Db%7Bc%25}:sliding:60000"]);
        assert_eq!(keys.legacy_overrides, "drip:{payouts|a%7Db%7Bc%25}:o");
        assert_eq!(overridden_keys("drip", "payouts"), "drip:{payouts}:overridden");
        assert_eq!(payload_key("drip", "payouts", "a}b{c%", "m1"), "drip:{payouts|a%7Db%7Bc%25}:p:m1");
        assert_eq!(dispatch_key("drip", "payouts", "a}b{c%", "m1"), "drip:{payouts|a%7Db%7Bc%25}:d:m1");
        let budgeted = RuleRef { id: "sms", tag: Some("gateway"), leases: None, classed: false };
        let keys = EntityKeys::new("drip", budgeted, "u{1}", "m1", Some(0), &limits);
        assert_eq!(keys.state, "drip:{b:gateway}:sms|u%7B1%7D:state");
        assert!(keys.sliding[0].starts_with("drip:{b:gateway}:"), "every key of the entity under the budget's tag");
    }

    #[test]
    fn a_queue_entry_keeps_its_body_or_names_where_it_is() {
        let limits = [Limit::new(1, 1_000, Window::Fixed(Placement::Start)).unwrap()];
        let keys = EntityKeys::new("drip", RuleRef::plain("payouts"), "k\n1", "m1", Some(125_000), &limits);
        let name = keys.parked_entry();
        let beside = [keys.answers.as_bytes(), b":q:", &keys.answer_field].concat();
        assert_eq!(EntryBody::of(&name), Some(EntryBody::At(beside)));
        // A body with newlines and a leading NUL of its own, after a name with a newline in its key.
        let body = b"\0{\"a\":\n1}\n";
        let entry = keys.parked_entry_with(body);
        assert!(entry.starts_with(format!("\0{}\n", name.len()).as_bytes()) && entry.ends_with(body));
        assert_eq!(EntryBody::of(&entry), Some(EntryBody::Kept(body)));
        assert_eq!(EntryBody::of(&keys.parked_entry_with(b"")), Some(EntryBody::Kept(b"")));
        for unwritten in [&b"short"[..], b"\0x\nname", b"\x0012\nshort", b"\0"] {
            assert_eq!(EntryBody::of(unwritten), None, "{unwritten:?}");
        }
    }

    #[test]
    fn a_leased_group_s_partitions_land_in_equal_shares_of_the_slots() {
        for partitions in [2, 3, 7, 16] {
            for partition in 0..partitions {
                let tag = partition_tag("gateway", partitions, partition);
                assert!(tag.starts_with(&format!("b:gateway|p{partition}~")), "{tag}");
                let (from, to) = slot_share(partitions, partition);
                assert!((from..to).contains(&slot(&tag)), "{tag}: slot {} not in {from}..{to}", slot(&tag));
            }
        }
        // What `CLUSTER KEYSLOT` answers (Redis's documentation: somekey is 11058).
        assert_eq!((slot("somekey"), slot("foo")), (11_058, 12_182));
        let leases = Leases { partitions: 3, chunk: 10_000 };
        let rule = RuleRef { id: "sms", tag: Some("gateway"), leases: Some(leases), classed: true };
        let keys = EntityKeys::new("drip", rule, "u1#otp", "m1", Some(0), &[]);
        let tag = partition_tag("gateway", 3, leases.partition_of("u1"));
        assert_eq!(keys.state, format!("drip:{{{tag}}}:sms|u1#otp:state"), "a class lives in its key's partition");
        assert!(class_calendar_key("drip", rule, "u1").starts_with(&format!("drip:{{{tag}}}:")));
    }

    /// A key may hold a `#` (a template renders what the event holds): on a rule with classes, a
    /// class's entity `<key>#<class>` is its key's, and a bare key (what it held before the rule
    /// had classes) is its own, however many `#` it holds.
    #[test]
    fn a_bare_key_with_a_hash_is_its_own_entity_on_a_rule_with_classes() {
        let text = "default_dlq_topic: dlq\nbudgets:\n  gateway: { limits: [ { limit: 90, per: 1s } ], leases: { partitions: 3 } }\nrules:\n  - name: sms\n    key: k\n    limits: [ { limit: 9, per: 1s } ]\n    max_delay: 1h\n    classes: { from: c, default: bulk, reserve: { live: 0.2 } }\n    budgets: [gateway]\n    forward: { topic: ready }\n    overflow_topic: overflow\n";
        let rules = drip_core::rules::RuleSet::parse("rules.yaml", text).unwrap();
        let rule = rules.rule("sms").unwrap();
        for (key, scope) in [("m#1", "m#1"), ("m#1#bulk", "m#1"), ("m#live", "m"), ("m", "m"), ("m#1#x", "m#1#x")] {
            assert_eq!(RuleRef::of_entity(rule, key).scope(key), scope, "{key}");
        }
        // The bare key's state is where it was before the rule had classes: its own tag and prefix.
        let before = RuleRef { classed: false, ..RuleRef::of(rule) };
        let bare = EntityKeys::new("drip", RuleRef::of_entity(rule, "m#1"), "m#1", "m1", Some(0), &[]);
        assert_eq!(bare.state, EntityKeys::new("drip", before, "m#1", "m1", Some(0), &[]).state);
        // A class of that key shares its partition.
        let class = EntityKeys::new("drip", RuleRef::of_entity(rule, "m#1#live"), "m#1#live", "m1", Some(0), &[]);
        assert_eq!(class.state.split(':').nth(1), bare.state.split(':').nth(1), "{class:?} {bare:?}");
    }
}

/// Field names and value encodings of the hashes the scripts keep: the one place Rust spells them
/// (the encoder, `inspect` and the plain commands use these; the scripts and their prelude are the
/// other half).
pub mod field {
    use drip_core::budgets::{AdaptiveState, LatencyState};
    use drip_core::rules::{Limit, Window};
    use drip_core::schedule::{FullRun, Reservation, Status, state_id};
    use drip_core::time::Millis;

    /// The entity's state hash (and a budget's, `exp`): its frontier, when its TTL was last set to
    /// end, the answers minute whose expiry is set.
    pub const FRONTIER: &str = "f";
    pub const EXPIRES: &str = "exp";
    pub const ANSWERS_EXPIRY: &str = "ab";
    /// How many of the entity's messages are parked, and when its drain's latest wake was armed for.
    pub const PARKED: &str = "q";
    pub const WAKE: &str = "wk";
    /// Until when the entity's queue of parked messages is kept (its last PEXPIRE's end).
    pub const QUEUE_EXPIRES: &str = "qx";
    /// The frontier as earlier versions named it (reserve.lua carries such an entity over).
    pub const LEGACY_FRONTIER: &str = "last";
    /// Since when the entity's reservations have charged its rule's shared budgets, and which:
    /// `<since>:<names>` (drip-core's `charged_budgets`), absent or empty when none.
    pub const CHARGES: &str = "ch";
    /// The entity's overrides, pause and adaptive level: one field of its state hash, `name=value`
    /// entries joined by `;` (the prelude's `parse_overrides`), absent for most entities.
    pub const OVERRIDES: &str = "o";
    /// Entries of the overrides field, and fields of a budget's hash: when a pause ends, and the
    /// adaptive level.
    pub const PAUSE: &str = "pause";
    pub const ADAPT: &str = "adapt";
    /// The latency controller's state, beside the adaptive level (`parse_latency`).
    pub const LATENCY: &str = "lat";
    /// A classes calendar: the last slot of what its key booked before the rule had classes,
    /// once the calendar took it over (0: nothing).
    pub const CARRIED: &str = "c";

    /// The charges field (`<since>:<names>`) as the model holds it: none when absent or empty.
    pub fn parse_charges(held: &str) -> Option<(Millis, String)> {
        let (since, names) = held.split_once(':')?;
        Some((since.parse().ok()?, names.to_owned()))
    }

    /// The overrides field's entries by name (as earlier versions held them in a hash of their own).
    pub fn parse_overrides_field(blob: &str) -> std::collections::BTreeMap<String, String> {
        blob.split(';')
            .filter_map(|entry| entry.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect()
    }

    /// A limit's two fields in the entity's state hash: fixed window and cost used in it, gcra TAT
    /// and remainder, sliding base (and nothing).
    pub fn limit_state(limit: &Limit) -> [String; 2] {
        let id = state_id(limit);
        match limit.window() {
            Window::Sliding => [format!("{id}:b"), String::new()],
            Window::Gcra { .. } => [format!("{id}:t"), format!("{id}:r")],
            Window::Fixed(_) => fixed_state(&id),
        }
    }

    /// A fixed window's fields under `id` (a limit, or a budget's fair share `share:<budget>:<per>`).
    pub fn fixed_state(id: &str) -> [String; 2] {
        [format!("{id}:w"), format!("{id}:u")]
    }

    /// A budget limit's window `<per>:<window>` (the cost reserved in it).
    pub fn budget_window(per: Millis, window: Millis) -> String {
        format!("{per}:{window}")
    }

    /// A budget field as a window `(per, window)`, if it is one.
    pub fn parse_budget_window(name: &str) -> Option<(Millis, Millis)> {
        let (per, window) = name.split_once(':')?;
        Some((per.parse().ok()?, window.parse().ok()?))
    }

    /// A floor-holding rule's part of a budget window: `<per>:<window>:f:<rule>`.
    pub fn budget_floor(per: Millis, window: Millis, rule: &str) -> String {
        format!("{per}:{window}:f:{rule}")
    }

    /// A `<per>:<window>:f:<rule>` field as its window and rule, if it is one.
    pub fn parse_budget_floor(name: &str) -> Option<(Millis, Millis, &str)> {
        let (window, rule) = name.split_once(":f:")?;
        let (per, window) = parse_budget_window(window)?;
        Some((per, window, rule))
    }

    /// A pool's lease of a budget window: `<per>:<window>:l` (the units its home leased it).
    pub fn pool_leased(per: Millis, window: Millis) -> String {
        format!("{per}:{window}:l")
    }

    /// What a pool gave back of its lease of a window, in all: `<per>:<window>:r`.
    pub fn pool_returned(per: Millis, window: Millis) -> String {
        format!("{per}:{window}:r")
    }

    /// A pool's windows with units given back (`<per>:<window>`, comma-separated), which the
    /// store sends their home after the call that gave them back.
    pub const POOL_RETURNS: &str = "R";

    /// The hash fields the reservation script writes by name, each as the script spells it
    /// (`FIELD_FRONTIER`): scripts.rs writes each value into the script as a Lua string, so no
    /// room spells a field of its own.
    pub const SCRIPT_FIELDS: [(&str, &str); 10] = [
        ("FIELD_FRONTIER", FRONTIER),
        ("FIELD_CHARGES", CHARGES),
        ("FIELD_EXPIRES", EXPIRES),
        ("FIELD_ANSWERS_EXPIRY", ANSWERS_EXPIRY),
        ("FIELD_PARKED", PARKED),
        ("FIELD_WAKE", WAKE),
        ("FIELD_QUEUE_EXPIRES", QUEUE_EXPIRES),
        ("FIELD_LEGACY_FRONTIER", LEGACY_FRONTIER),
        ("FIELD_CARRIED", CARRIED),
        ("FIELD_POOL_RETURNS", POOL_RETURNS),
    ];

    /// A pool's last window its home had no room in when it last asked: `F:<per>`.
    pub fn pool_full(per: Millis) -> String {
        format!("F:{per}")
    }

    /// A pool's latest window it holds a lease in: `T:<per>` (past it, its search jumps).
    pub fn pool_top(per: Millis) -> String {
        format!("T:{per}")
    }

    /// A pool's hint: no window up to `B:<per>` has room left (its walk jumps past them).
    pub fn pool_booked(per: Millis) -> String {
        format!("B:{per}")
    }

    /// A pool's last window of a longer limit it looked at for giving up its shorter limits'
    /// leases inside: `G:<per>`.
    pub fn pool_given_up(per: Millis) -> String {
        format!("G:{per}")
    }

    /// A pool's stranded units so far: what it was leased of passed windows and did not book
    /// (counted as it drops them; after a gap of many windows, not counted).
    pub fn pool_stranded(per: Millis) -> String {
        format!("S:{per}")
    }

    /// A home's lease of a window to one partition: `<per>:<window>:p<partition>`.
    pub fn home_granted(per: Millis, window: Millis, partition: u32) -> String {
        format!("{per}:{window}:p{partition}")
    }

    /// A `<per>:<window>:l` or `<per>:<window>:p<partition>` field as its window and what follows.
    pub fn parse_lease_field(name: &str) -> Option<(Millis, Millis, &str)> {
        let (per, rest) = name.split_once(':')?;
        let (window, what) = rest.split_once(':')?;
        Some((per.parse().ok()?, window.parse().ok()?, what))
    }

    /// A budget limit's oldest window the hash may hold (older ones are dropped when it moves).
    pub fn budget_oldest(per: Millis) -> String {
        format!("lo:{per}")
    }

    /// A budget limit's run of full windows: field `run:<per>`, value `<from>:<through>:<least>`.
    pub fn budget_run(per: Millis) -> String {
        format!("run:{per}")
    }

    /// A `run:<per>` field and its value, read back.
    pub fn parse_budget_run(name: &str, value: &str) -> Option<(Millis, FullRun)> {
        let per = name.strip_prefix("run:")?.parse().ok()?;
        let mut parts = value.splitn(3, ':');
        let (from, through, least) = (parts.next()?, parts.next()?, parts.next()?);
        Some((per, FullRun { from: from.parse().ok()?, through: through.parse().ok()?, least: least.parse().ok()? }))
    }

    /// An adaptive level: `<level>:<window number>`, with `:l` when a latency report set it (the
    /// prelude's `parse_level`).
    pub fn parse_adaptive(text: &str) -> Option<AdaptiveState> {
        let (level, rest) = text.split_once(':')?;
        let (window, by_latency) = match rest.strip_suffix(":l") {
            Some(window) => (window, true),
            None => (rest, false),
        };
        Some(AdaptiveState { level: level.parse().ok()?, window: window.parse().ok()?, by_latency })
    }

    /// The latency controller's state: `<baseline>:<hurt>:<cut>:<grown>:<window>:<level>` (the
    /// prelude's `parse_latency`).
    pub fn parse_latency(text: &str) -> Option<LatencyState> {
        let mut parts = text.split(':');
        let mut next = || parts.next()?.parse::<i64>().ok();
        let (baseline, hurt, cut, grown, window, level) = (next()?, next()?, next()?, next()?, next()?, next()?);
        let unsigned = |n: i64| u64::try_from(n).ok();
        Some(LatencyState {
            baseline: unsigned(baseline)?,
            hurt: unsigned(hurt)?,
            cut: unsigned(cut)?,
            grown: unsigned(grown)?,
            window,
            level: unsigned(level)?,
        })
    }

    /// The slot of a reserved event's answer (`R<slot>:...`, relative to `base`); `None` for a
    /// dead-lettered one (`L`, `C`).
    pub fn reserved_slot(answer: &str, base: Millis) -> Option<Millis> {
        let slot = answer.strip_prefix('R')?.split(':').next()?;
        Some(base + slot.parse::<Millis>().ok()?)
    }

    /// A completed answer, `<R|L|C><slot>:<decided>:d[:<cost>]`, times relative to the answers'
    /// `base`, the cost it booked when not 1 (the prelude's `answer_value`).
    pub fn completed_answer(reservation: &Reservation, base: Millis, cost: u64) -> String {
        let kind = match reservation.status {
            Status::Reserved => 'R',
            Status::MaxDelayExceeded => 'L',
            Status::CostExceedsLimit => 'C',
            Status::Parked => 'P',
        };
        let booked = if cost == 1 { String::new() } else { format!(":{cost}") };
        format!("{kind}{}:{}:d{booked}", reservation.slot - base, reservation.decided_at - base)
    }
}
