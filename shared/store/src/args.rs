//! The writing half of the argument contract with the Lua scripts; `lua/prelude.lua`'s cursor
//! (`str()`, `int()`) is the reading half, and each script's `read_*` function names what it reads
//! in this order. Values are written in order, each under the name the script reads it by; a
//! section is a count, then that many records; `''` is "none". A golden test pins the arguments of
//! one rich request as `name = value` lines, so that a change to the contract is a diff that says
//! which field moved.

use drip_core::budgets::{Adaptive, Budget, FairRing, adaptive_window};
use drip_core::fair::Member;
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{OldSlot, override_id};
use drip_core::time::Millis;

use crate::keys::{ANSWER_BUCKET, budget_key, class_calendar_key, field, pool_key};
use crate::keys::{ANSWER_MARGIN, STATE_MARGIN};
use crate::{keys::EntityKeys, request::SlotRequest};

/// The event's fixed record, in the order [`ReserveArgs::event`] writes it: `reserve.lua`'s
/// `read_event` reads each field at its place by a constant generated from its name
/// (`event.cost` is `EVENT_COST`; scripts.rs), never by a number of its own.
pub(crate) const EVENT_RECORD: [&str; 16] = [
    "event.first_key",
    "event.answer_field",
    "event.cost",
    "event.max_delay",
    "event.answers_base",
    "event.answers_keep",
    "event.lease",
    "event.state_keep",
    "event.mode",
    "event.park",
    "event.floor",
    "event.margin",
    "adaptive.ceiling",
    "adaptive.step",
    "adaptive.window",
    "event.body",
];

/// One limit's record in the event's `limits` section, read the same way.
pub(crate) const LIMIT_RECORD: [&str; 5] =
    ["limit.kind", "limit.per", "limit.count", "limit.extra", "limit.override_id"];

/// The entity state's one HMGET, by name: the fields before the limits' pairs, and those after
/// them, each with its hash field. The script reads each at its place by a constant generated from
/// its name (`state.frontier` is `STATE_FRONTIER`, a place among the head; `state.parked` is
/// `STATE_PARKED`, a place among the tail, after `STATE_HEAD` fields and two per limit; scripts.rs).
pub(crate) const STATE_HEAD: [(&str, &str); 3] = [
    ("state.frontier", field::FRONTIER),
    ("state.expires", field::EXPIRES),
    ("state.answers_expiry", field::ANSWERS_EXPIRY),
];
pub(crate) const STATE_TAIL: [(&str, &str); 6] = [
    ("state.parked", field::PARKED),
    ("state.wake", field::WAKE),
    ("state.queue_expires", field::QUEUE_EXPIRES),
    ("state.overrides", field::OVERRIDES),
    ("state.legacy_frontier", field::LEGACY_FRONTIER),
    ("state.charges", field::CHARGES),
];

/// A budget's one HMGET, by name, as STATE_HEAD and STATE_TAIL are the entity's: the fields before
/// the limits' columns; the columns (each one field per limit of the budget, the pool's three only
/// for a leased budget), read at `BUDGET_HEAD + (column - 1) * limits + j`; and, for a classes
/// calendar, the fields after them.
pub(crate) const BUDGET_HEAD: [(&str, &str); 3] =
    [("budget.pause", field::PAUSE), ("budget.adapt", field::ADAPT), ("budget.expires", field::EXPIRES)];
pub(crate) const BUDGET_COLUMNS: [&str; 6] = [
    "budget.oldest",
    "budget.run",
    "budget.pool_full",
    "budget.pool_top",
    "budget.pool_booked",
    "budget.pool_given_up",
];
pub(crate) const BUDGET_TAIL: [(&str, &str); 2] =
    [("budget.overrides", field::OVERRIDES), ("budget.carried", field::CARRIED)];

/// An event's keys, in KEYS from the event's first (`event.first_key`): the script reads each at
/// `e.base + KEY_ANSWERS` and so on, a sliding limit's at `e.base + KEY_SLIDING - 1 + extra`.
/// Its budgets' hashes follow, at the offsets its limits name.
pub(crate) const EVENT_KEYS: [&str; 4] = ["key.state", "key.answers", "key.legacy_overrides", "key.sliding"];

/// An entity's keys in the order of EVENT_KEYS.
fn event_keys(keys: &EntityKeys) -> Vec<String> {
    let mut list = Vec::with_capacity(EVENT_KEYS.len() + keys.sliding.len());
    for name in EVENT_KEYS {
        match name {
            "key.state" => list.push(keys.state.clone()),
            "key.answers" => list.push(keys.answers.clone()),
            "key.legacy_overrides" => list.push(keys.legacy_overrides.clone()),
            "key.sliding" => list.extend(keys.sliding.iter().cloned()),
            other => unreachable!("EVENT_KEYS names {other}, which event_keys does not write"),
        }
    }
    list
}

/// A column's hash field for the budget limit of period `per`.
fn budget_column(column: &str, per: Millis) -> String {
    match column {
        "budget.oldest" => field::budget_oldest(per),
        "budget.run" => field::budget_run(per),
        "budget.pool_full" => field::pool_full(per),
        "budget.pool_top" => field::pool_top(per),
        "budget.pool_booked" => field::pool_booked(per),
        _ => field::pool_given_up(per),
    }
}

/// Arguments in the order a script reads them, each with the name it is read by: the values end to
/// end in one buffer (a call's events write a few dozen each, so that writing one costs no
/// allocation of its own), where each ends, and its name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    data: Vec<u8>,
    ends: Vec<usize>,
    names: Vec<&'static str>,
}

impl Args {
    pub fn int(&mut self, name: &'static str, n: impl Into<i64>) -> &mut Self {
        self.data.extend_from_slice(itoa::Buffer::new().format(n.into()).as_bytes());
        self.end(name)
    }

    pub fn opt(&mut self, name: &'static str, n: Option<impl Into<i64>>) -> &mut Self {
        match n {
            Some(n) => self.int(name, n),
            None => self.end(name),
        }
    }

    pub fn str(&mut self, name: &'static str, s: impl AsRef<[u8]>) -> &mut Self {
        self.data.extend_from_slice(s.as_ref());
        self.end(name)
    }

    /// Ends the value written since the last one, under `name`.
    fn end(&mut self, name: &'static str) -> &mut Self {
        self.ends.push(self.data.len());
        self.names.push(name);
        self
    }

    /// A count-prefixed section: `items.len()` (named `name`), then each item as `write` writes it.
    pub fn section<T>(&mut self, name: &'static str, items: &[T], mut write: impl FnMut(&mut Self, &T)) -> &mut Self {
        self.int(name, items.len() as i64);
        for item in items {
            write(self, item);
        }
        self
    }

    /// How many values are written.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Where the value at `at` lies in the buffer.
    fn span(&self, at: usize) -> std::ops::Range<usize> {
        let start = if at == 0 { 0 } else { self.ends[at - 1] };
        start..self.ends[at]
    }

    /// Each value, in order.
    pub fn values(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.ends.len()).map(|at| &self.data[self.span(at)])
    }

    /// Each value with its name, in order.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        self.names.iter().copied().zip(self.values())
    }

    /// Replaces the value written under `name`.
    fn set(&mut self, name: &'static str, value: impl AsRef<[u8]>) -> &mut Self {
        if let Some(at) = self.names.iter().position(|&n| n == name) {
            let (span, value) = (self.span(at), value.as_ref());
            let (old, new) = (span.len(), value.len());
            self.data.splice(span, value.iter().copied());
            for end in &mut self.ends[at..] {
                *end = *end + new - old;
            }
        }
        self
    }

    fn extend(&mut self, other: &Args) {
        let base = self.data.len();
        self.data.extend_from_slice(&other.data);
        self.ends.extend(other.ends.iter().map(|end| base + end));
        self.names.extend(other.names.iter().copied());
    }
}

/// One reserve.lua call: the keys of every event in it (each event's group starting where its
/// first argument says) and the arguments. `events` events, reserved one after another in order.
#[derive(Debug, Clone)]
pub struct ReserveArgs {
    pub keys: Vec<String>,
    pub events: Vec<Args>,
    now: Option<Millis>,
    /// Which of the script's paths its lean-shaped events take.
    paths: ReservePaths,
    /// The last event written in full with mode `lean`: its place in `events` and its keys'.
    last_lean: Option<(usize, std::ops::Range<usize>)>,
    /// The same for the last event written in full for the general path.
    last_full: Option<(usize, std::ops::Range<usize>)>,
    /// Leases the call credits to partitions' pools before its events (reserve.lua's `credit`).
    credits: Vec<Args>,
}

/// Where an event's leased budget asks for units (`lua/lease.lua`) and how much: its home's hash,
/// its partition, and per budget limit its period, count and what one lease asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTarget {
    pub budget: String,
    pub home: String,
    /// The pool's key, which the credit names.
    pub pool: String,
    pub partition: u32,
    pub partitions: u32,
    /// The budget is fair: its home shares each window max-min fair among the partitions.
    pub fair: bool,
    /// By budget limit: per, count, the units one lease asks for.
    pub limits: Vec<(Millis, u64, u64)>,
    /// An adaptive budget's ceiling, step (ppm) and window: its home grants from the count at its
    /// level in force.
    pub level: Option<(u64, u64, Millis)>,
}

impl LeaseTarget {
    /// Where `budget` (leased) asks for units from `partition`'s pool: `limits` empty (a pool a
    /// signal or a return goes to, not a reservation).
    pub(crate) fn of_pool(namespace: &str, budget: &Budget, partition: u32) -> Option<Self> {
        let leases = budget.leases?;
        let level = budget.adaptive.map(|a| (a.ceiling(), a.step, adaptive_window(&budget.limits)));
        Some(LeaseTarget {
            budget: budget.name.clone(),
            home: budget_key(namespace, budget),
            pool: pool_key(namespace, budget, partition),
            partition,
            partitions: leases.partitions,
            fair: budget.fair.is_some(),
            limits: Vec::new(),
            level,
        })
    }
}

/// What a home leased a pool of one budget limit (`Lease` of the model), to be credited to the
/// pool by the partition's next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub per: Millis,
    pub lease: drip_core::schedule::Lease,
    /// How long the pool must keep it at least: the window's end and a margin, from `now`.
    pub keep: Millis,
}

/// One event's keys and arguments, encoded on its own (its first argument, where its keys start in
/// the call, is written when it joins one: [`ReserveArgs::push`]), so that events encoded by
/// different requests can share a call.
#[derive(Debug, Clone)]
pub struct EncodedEvent {
    keys: Vec<String>,
    args: Args,
    /// By budget (in the event's order): where a leased one asks for units.
    pub(crate) leases: Vec<Option<LeaseTarget>>,
    pub(crate) cost: u64,
    /// Whether it may give units back (a new slot for an event that gave its old one back, or a
    /// correction): its leased budgets' pools may then have units to return to their homes.
    pub(crate) gives_back: bool,
}

impl EncodedEvent {
    /// `request`'s event, its keys `keys` (the entity's) and its budgets' hashes.
    pub fn new(namespace: &str, keys: &EntityKeys, request: &SlotRequest<'_>) -> Self {
        let (keys, args) = ReserveArgs::encode(namespace, keys, request);
        let leases = lease_targets(namespace, request);
        let gives_back = request.reslot == Some(drip_core::schedule::OldSlot::GivenBack);
        Self { keys, args, leases, cost: request.event.cost, gives_back }
    }

    /// The event's first key (its entity's state): every key of the event shares its hash tag.
    pub fn first_key(&self) -> &str {
        self.keys.first().map_or("", String::as_str)
    }

    /// Whether it draws from a leased budget (its call may stop at it to ask for a lease).
    pub fn leased(&self) -> bool {
        self.leases.iter().any(Option::is_some)
    }

    /// The same event sent again after its call stopped at it for a lease: a new slot that gave
    /// its old slot's units back did so already, and now keeps them.
    pub(crate) fn again(mut self) -> Self {
        if value_of(&self.args, "event.mode") == b"give" {
            self.args.set("event.mode", "keep");
        }
        self
    }
}

/// By budget of the request: where a leased one asks its home for units (empty when none is
/// leased: most events, which then allocate nothing for it).
pub(crate) fn lease_targets(namespace: &str, request: &SlotRequest<'_>) -> Vec<Option<LeaseTarget>> {
    let event = &request.event;
    if event.budgets.iter().all(|b| b.leases.is_none()) {
        return Vec::new();
    }
    let scope = request.scope();
    event
        .budgets
        .iter()
        .map(|b| {
            let leases = b.leases?;
            let limits = b.limits.iter().map(|l| (l.per(), l.limit(), leases.want(l.limit(), event.cost))).collect();
            Some(LeaseTarget { limits, ..LeaseTarget::of_pool(namespace, b, leases.partition_of(scope))? })
        })
        .collect()
}

/// The value written under `name` (empty when none is).
fn value_of<'a>(args: &'a Args, name: &str) -> &'a [u8] {
    args.named().find(|(n, _)| *n == name).map_or(&[], |(_, value)| value)
}

/// What a lean event written as like another (`=`: reserve.lua's `read_like`) has of its own:
/// where its keys start, its message and its cost.
const LIKE_OWN: [&str; 3] = ["event.first_key", "event.answer_field", "event.cost"];

/// What a general event written as another (`~`: reserve.lua's `read_alike`) has of its own: where
/// its keys start, its message, cost and answers minute, the body it keeps should it park, and its
/// key in its fair budgets' rings.
const ALIKE_OWN: [&str; 6] =
    ["event.first_key", "event.answer_field", "event.cost", "event.answers_base", "event.body", "budget.ring_member"];

/// Whether two records are the same but for the values of `own`.
fn same_but(a: &Args, b: &Args, own: &[&str]) -> bool {
    a.len() == b.len()
        && a.named().zip(b.named()).all(|((name, x), (other, y))| name == other && (x == y || own.contains(&name)))
}

/// Whether an event takes reserve.lua's lean path (`lua/reserve/lean.lua`, mode `lean`): a plain
/// reservation (not a new slot, a drain or a correction) under its key's own limits alone, with no
/// budget, no class and no floor carried over. The script still hands it to the general path when
/// its key turns out to need more (overrides, a pause, a level, a parked backlog).
fn lean_shape(request: &SlotRequest<'_>) -> bool {
    let event = &request.event;
    event.budgets.is_empty() && event.class.is_none() && event.floor.is_none() && request.parked_body.is_none()
}

/// Which of reserve.lua's paths the events of the lean shape take: the lean one (what the store
/// does), the general one, or each by its message (about half each way, in one call or one after
/// another: the differential tests run the mixed paths beside the lean one against the model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReservePaths {
    #[default]
    Lean,
    General,
    Mixed,
}

/// How reserve.lua names a limit's kind (a budget limit's placement: `fixed` or `spread`).
pub fn script_kind(limit: &Limit) -> &'static str {
    match limit.window() {
        Window::Fixed(Placement::Start) => "fixed",
        Window::Fixed(Placement::Spread) => "spread",
        Window::Sliding => "sliding",
        Window::Gcra { .. } => "gcra",
    }
}

/// How long an answers hash outlives max(its minute's start, the time of its last answer): the
/// minute itself, `max_delay`, and a margin for late redeliveries.
pub fn answers_keep(max_delay: Millis) -> Millis {
    ANSWER_BUCKET + max_delay + ANSWER_MARGIN
}

/// An adaptive limit as the scripts read it: ceiling, step (ppm) and window (ms), or three nones.
fn adaptive(args: &mut Args, adaptive: Option<&Adaptive>, limits: &[Limit]) {
    match adaptive {
        None => args.str("adaptive.ceiling", "").str("adaptive.step", "").str("adaptive.window", ""),
        Some(a) => args
            .int("adaptive.ceiling", a.ceiling() as i64)
            .int("adaptive.step", a.step as i64)
            .int("adaptive.window", adaptive_window(limits)),
    };
}

/// One limit of the entity's own state as reserve.lua's `read_event` reads it.
struct EntityLimit {
    kind: &'static str,
    limit: Limit,
    /// gcra: its burst; sliding: its sorted set's number among the event's; share: its budget's.
    extra: i64,
    state_fields: [String; 2],
    /// Its override's id in the entity's overrides (a share has none).
    override_id: String,
}

impl ReserveArgs {
    /// A call at `now` (`None`: the server's `TIME`).
    pub fn new(now: Option<Millis>) -> Self {
        Self {
            keys: Vec::new(),
            events: Vec::new(),
            now,
            credits: Vec::new(),
            paths: ReservePaths::Lean,
            last_lean: None,
            last_full: None,
        }
    }

    /// The same call with its lean-shaped events sent down `paths`.
    pub fn with_paths(mut self, paths: ReservePaths) -> Self {
        self.paths = paths;
        self
    }

    /// Credits a lease to the pool `pool` before the call's events (its key joins the call's).
    pub fn credit(&mut self, pool: &str, credit: Credit) -> &mut Self {
        self.keys.push(pool.to_owned());
        let mut args = Args::default();
        let Credit { per, lease, keep } = credit;
        args.int("credit.key", self.keys.len() as i64)
            .int("credit.per", per)
            .opt("credit.window", lease.window)
            .int("credit.total", lease.total as i64)
            .int("credit.full_through", lease.full_through)
            .int("credit.keep", keep);
        self.credits.push(args);
        self
    }

    /// Adds `request`'s event, its keys `keys` (the entity's) and its budgets' hashes.
    pub fn event(&mut self, namespace: &str, keys: &EntityKeys, request: &SlotRequest<'_>) -> &mut Self {
        let (keys, args) = Self::encode(namespace, keys, request);
        self.add(keys, args)
    }

    /// `request`'s event: its keys (its entity's, then its budgets' hashes) and its record, whose
    /// offsets count from its first key (`event.first_key`, written when it joins a call: `add`).
    fn encode(namespace: &str, keys: &EntityKeys, request: &SlotRequest<'_>) -> (Vec<String>, Args) {
        let event = &request.event;
        // Each offset below is where a key sits counted from the event's first (KEYS[e.base + offset]).
        let mut own_keys = event_keys(keys);
        let budgets_at = own_keys.len() as i64;
        let (scope, class) = event.class.unzip();
        own_keys.extend(event.budgets.iter().map(|b| match (b.per_key, scope) {
            (true, Some(scope)) => class_calendar_key(namespace, request.rule_ref(), scope),
            _ => match b.leases {
                Some(leases) => pool_key(namespace, b, leases.partition_of(request.scope())),
                None => budget_key(namespace, b),
            },
        }));
        // A classes calendar's key's own state: what it booked before the rule had classes.
        let carry_at = own_keys.len() as i64;
        if let Some(scope) = scope.filter(|_| event.budgets.iter().any(|b| b.per_key)) {
            own_keys.push(EntityKeys::of_entity(namespace, request.rule_ref(), scope, &[]).state);
        }
        // A fair budget's ring of waiting keys, then its drain's hash: a key that parks joins the
        // ring and arms the drain in the same call.
        let ring_at = own_keys.len() as i64;
        if let Some(fair) = event.budgets.iter().find(|b| b.fair.is_some()) {
            own_keys.extend(crate::keys::fair_keys(namespace, FairRing::of_key(fair, request.scope())));
        }
        let member = crate::keys::ring_member(&Member { rule: request.rule.to_owned(), key: request.key.to_owned() });

        let budget_limits = event.budgets.iter().flat_map(|b| &b.limits);
        let longest_window =
            event.limits.iter().chain(budget_limits).map(|l| l.per()).max().unwrap_or(0) + event.margin;
        let mut sliding = 0;
        let mut limits: Vec<EntityLimit> = event
            .limits
            .iter()
            .map(|limit| {
                let extra = match limit.window() {
                    Window::Sliding => {
                        sliding += 1;
                        sliding
                    }
                    Window::Gcra { burst } => burst as i64,
                    Window::Fixed(_) => 0,
                };
                EntityLimit {
                    kind: script_kind(limit),
                    limit: *limit,
                    extra,
                    state_fields: field::limit_state(limit),
                    override_id: override_id(limit),
                }
            })
            .collect();
        // Each budget's fair share is one more fixed limit on the entity's own slots (a class's
        // key's, one more limit of its calendar: `calendar_shares`).
        let own_shares =
            event.budgets.iter().enumerate().filter(|(_, b)| b.max_share.is_some() && event.class.is_none());
        for (number, budget) in own_shares {
            for limit in &budget.limits {
                let id = budget.share_id(limit);
                limits.push(EntityLimit {
                    kind: "share",
                    limit: *limit,
                    extra: number as i64 + 1,
                    state_fields: field::fixed_state(&id),
                    override_id: String::new(),
                });
            }
        }

        let mut args = Args::default();
        // Where its keys start in its call: `add` writes it.
        args.int("event.first_key", 1)
            .str("event.answer_field", keys.answer_field)
            .int("event.cost", event.cost as i64)
            .int("event.max_delay", event.max_delay)
            .int("event.answers_base", keys.answers_base)
            .int("event.answers_keep", answers_keep(event.max_delay))
            .int("event.lease", event.lease)
            .int("event.state_keep", longest_window + STATE_MARGIN)
            .str(
                "event.mode",
                match (request.unpark, request.reslot) {
                    (Some(_), _) => "unpark",
                    (None, None) if lean_shape(request) => "lean",
                    (None, None) => "",
                    (None, Some(OldSlot::Kept)) => "keep",
                    (None, Some(OldSlot::GivenBack)) => "give",
                },
            )
            // An unpark's deadline, else the rule's park horizon.
            .opt("event.park", request.unpark.or(event.park))
            .opt("event.floor", event.floor)
            .int("event.margin", event.margin);
        adaptive(&mut args, event.adaptive.as_ref(), event.limits);
        // Kept (where its answer is filed, for as long) should it park: parking.lua's park.
        args.str("event.body", request.parked_body.unwrap_or_default());
        args.section("limits", &limits, |args, l| {
            args.str("limit.kind", l.kind)
                .int("limit.per", l.limit.per())
                .int("limit.count", l.limit.limit() as i64)
                .int("limit.extra", l.extra)
                .str("limit.override_id", &l.override_id);
        });
        // The fields of the state's one HMGET, in order: STATE_HEAD, each limit's two, STATE_TAIL.
        for (_, name) in STATE_HEAD {
            args.str("state_field", name);
        }
        for name in limits.iter().flat_map(|l| &l.state_fields) {
            args.str("state_field", name);
        }
        for (_, name) in STATE_TAIL {
            args.str("state_field", name);
        }
        let numbered: Vec<(i64, &_)> =
            event.budgets.iter().enumerate().map(|(i, b)| (budgets_at + i as i64, b)).collect();
        args.section("budgets", &numbered, |args, (key, budget)| {
            args.int("budget.key", *key);
            adaptive(args, budget.adaptive.as_ref(), &budget.limits);
            args.opt("budget.max_share", budget.max_share.map(|share| share as i64));
            args.int("budget.leased", i64::from(budget.leases.is_some()));
            // A classes calendar holds its key's overrides of the rule's limits and carries over
            // what the key booked before the rule had classes (its last two fields).
            args.int("budget.per_key", i64::from(budget.per_key));
            // A fair budget's near horizon (0: not fair): an event whose slot lies past it parks.
            args.int("budget.near", budget.near().unwrap_or(0));
            if budget.fair.is_some() {
                args.int("budget.ring_key", ring_at).str("budget.ring_member", &member);
            }
            if budget.per_key {
                args.int("budget.carry_key", carry_at);
            }
            args.section("budget.limits", &budget.limits, |args, limit| {
                args.int("budget.limit.per", limit.per())
                    .int("budget.limit.count", limit.limit() as i64)
                    .str("budget.limit.kind", script_kind(limit));
            });
            let shares =
                if budget.per_key { drip_core::budgets::calendar_shares(budget, event.budgets) } else { Vec::new() };
            if budget.per_key {
                // Which budget and limit, 1-based as reserve.lua indexes them.
                args.section("budget.shares", &shares, |args, share| {
                    args.int("budget.share.per", share.per)
                        .int("budget.share.budget", share.budget as i64 + 1)
                        .int("budget.share.limit", share.limit as i64 + 1)
                        .str("budget.share.id", &share.id)
                        .int("budget.share.counts", i64::from(share.counts));
                });
            }
            let pers: Vec<Millis> =
                budget.limits.iter().map(Limit::per).chain(shares.iter().map(|share| share.per)).collect();
            // A classes calendar's floors are its classes' reserves; a budget's, its rules' and keys'.
            let member = if budget.per_key {
                class.unwrap_or_default()
            } else {
                budget.floor_member(request.rule, request.scope())
            };
            args.section("budget.floors", &budget.floors, |args, (name, floor)| {
                args.str("budget.floor.rule", name)
                    .int("budget.floor.ppm", *floor as i64)
                    .int("budget.floor.own", i64::from(name == member));
            });
            // The fields its HMGET names: BUDGET_HEAD, then each column of BUDGET_COLUMNS a limit at a
            // time (the pool's four only for a leased budget), then a calendar's BUDGET_TAIL.
            for (_, name) in BUDGET_HEAD {
                args.str("budget_field", name);
            }
            let columns = if budget.leases.is_some() { BUDGET_COLUMNS.len() } else { 2 };
            for column in &BUDGET_COLUMNS[..columns] {
                for &per in &pers {
                    args.str("budget_field", budget_column(column, per));
                }
            }
            if budget.per_key {
                for (_, name) in BUDGET_TAIL {
                    args.str("budget_field", name);
                }
            }
        });
        if !event.budgets.is_empty() {
            // The shared budgets it charges (the state remembers them, and since when).
            args.str("event.charges", drip_core::budgets::charged_budgets(event.budgets));
        }
        (own_keys, args)
    }

    /// Adds a correction of `request`'s message: the cost reported after its call, `actual`
    /// (reserve.lua's `correct`), in place of a reservation.
    pub fn correction(
        &mut self,
        namespace: &str,
        keys: &EntityKeys,
        request: &SlotRequest<'_>,
        actual: u64,
    ) -> &mut Self {
        let (keys, mut args) = Self::encode(namespace, keys, request);
        args.set("event.mode", "correct").set("event.cost", actual.to_string());
        self.add(keys, args)
    }

    /// Adds an event encoded on its own, its keys after those already in the call.
    pub fn push(&mut self, event: EncodedEvent) -> &mut Self {
        self.add(event.keys, event.args)
    }

    /// Adds an event's keys and record, its mode as `paths` says: in full, its keys after those
    /// already in the call (`event.first_key` says where they start); or, when its record is the
    /// call's last one of its path but for what is its own, as that: a lean event (a key's burst,
    /// or another key of the same rule in the same minute) as four values, `=`, where its keys
    /// start (the last one's when they are the same), its answer field and its cost (reserve.lua's
    /// `read_like`); a general one (a drain's heads, a group commit's budgeted events) as `~`,
    /// where its keys start and the values of `ALIKE_OWN` (`read_alike`).
    fn add(&mut self, keys: Vec<String>, mut args: Args) -> &mut Self {
        let general = match self.paths {
            ReservePaths::Lean => false,
            ReservePaths::General => true,
            // By the message, so that lone events mix as well as a call's.
            ReservePaths::Mixed => value_of(&args, "event.answer_field").last().is_some_and(|b| b % 2 == 1),
        };
        let lean = value_of(&args, "event.mode") == b"lean";
        if lean && general {
            args.set("event.mode", "");
        }
        let lean = lean && !general;
        let (last, own, mark) = if lean {
            (self.last_lean.clone(), &LIKE_OWN[..], ("event.like", "="))
        } else {
            (self.last_full.clone(), &ALIKE_OWN[..], ("event.alike", "~"))
        };
        if let Some((at, range)) = last
            && same_but(&self.events[at], &args, own)
        {
            // A key's burst, a drain's heads, or a group commit's events of one rule: the keys of
            // each (the same ones for a key's next event), and what is its own.
            let first_key = self.reuse_keys(range, keys);
            let mut like = Args::default();
            like.str(mark.0, mark.1).int("event.first_key", first_key as i64);
            for (name, value) in args.named().filter(|(name, _)| own[1..].contains(name)) {
                like.str(name, value);
            }
            self.events.push(like);
            return self;
        }
        let written = Some((self.events.len(), self.keys.len()..self.keys.len() + keys.len()));
        if lean {
            self.last_lean = written;
        } else {
            self.last_full = written;
        }
        args.set("event.first_key", (self.keys.len() as i64 + 1).to_string());
        self.keys.extend(keys);
        self.events.push(args);
        self
    }

    /// Where an event written as another starts its keys: at the other's (`range`) when they are
    /// the same (a key's next event), else after those already in the call.
    fn reuse_keys(&mut self, range: std::ops::Range<usize>, keys: Vec<String>) -> usize {
        if self.keys[range.clone()] == keys[..] {
            range.start + 1
        } else {
            self.keys.extend(keys);
            self.keys.len() - range.len() + 1
        }
    }

    /// The arguments in order: now, the section of credits, then the section of events.
    pub fn args(&self) -> Args {
        let mut args = Args::default();
        args.opt("now", self.now).section("credits", &self.credits, |args, credit| args.extend(credit));
        args.section("events", &self.events, |args, event| args.extend(event));
        args
    }
}

#[cfg(test)]
mod tests {
    use drip_core::rules::{Limit, Placement, Window};
    use drip_core::schedule::ReserveRequest;

    use super::*;

    /// Values end to end in one buffer: one replaced by a longer or a shorter one, or none, moves
    /// every value after it and leaves the others as written; two records joined keep both.
    #[test]
    fn a_value_replaced_in_the_buffer_leaves_its_neighbours_as_written() {
        let mut args = Args::default();
        args.int("a", -12).str("b", "mode").opt("c", None::<i64>).int("d", 7).str("e", "");
        args.set("b", "unpark");
        args.set("c", "3");
        args.set("a", "");
        let named: Vec<(&str, &[u8])> = args.named().collect();
        assert_eq!(named, [("a", &b""[..]), ("b", b"unpark"), ("c", b"3"), ("d", b"7"), ("e", b"")]);
        args.set("b", "k");
        args.set("missing", "x");
        let mut joined = Args::default();
        joined.int("n", 2);
        joined.extend(&args);
        let values: Vec<&[u8]> = joined.values().collect();
        assert_eq!(values, [&b"2"[..], b"", b"k", b"3", b"7", b""]);
        assert_eq!(joined.len(), 6);
    }

    /// The script reads the records at the places these names give: the encoder writes them so.
    #[test]
    fn the_encoder_writes_the_records_the_script_reads_by_name() {
        let limits = [
            Limit::new(10, 1_000, Window::Fixed(Placement::Start)).unwrap(),
            Limit::new(5, 1_000, Window::Gcra { burst: 2 }).unwrap(),
        ];
        let request = SlotRequest::new("r", "k", ReserveRequest::new("m", &limits, 0));
        let keys = EntityKeys::new("drip", request.rule_ref(), "k", "m", None, &limits);
        let mut call = ReserveArgs::new(None);
        call.event("drip", &keys, &request);
        let names: Vec<&str> = call.events[0].named().map(|(name, _)| name).collect();
        assert_eq!(names[..EVENT_RECORD.len()], EVENT_RECORD);
        let limits_at = EVENT_RECORD.len();
        assert_eq!(names[limits_at], "limits");
        for limit in names[limits_at + 1..].chunks(LIMIT_RECORD.len()).take(limits.len()) {
            assert_eq!(limit, LIMIT_RECORD);
        }
    }

    /// The event's keys sit where EVENT_KEYS says, from its first: the script reads them by the
    /// KEY_* offsets generated from those names.
    #[test]
    fn the_event_s_keys_sit_at_their_named_offsets() {
        let limits =
            [Limit::new(10, 1_000, Window::Sliding).unwrap(), Limit::new(50, 60_000, Window::Sliding).unwrap()];
        let request = SlotRequest::new("r", "k", ReserveRequest::new("m", &limits, 0));
        let keys = EntityKeys::new("drip", request.rule_ref(), "k", "m", None, &limits);
        let mut call = ReserveArgs::new(None);
        call.event("drip", &keys, &request);
        let offset = |name: &str| EVENT_KEYS.iter().position(|n| *n == name).expect(name);
        assert_eq!(call.keys[offset("key.state")], keys.state);
        assert_eq!(call.keys[offset("key.answers")], keys.answers);
        assert_eq!(call.keys[offset("key.legacy_overrides")], keys.legacy_overrides);
        assert_eq!(call.keys[offset("key.sliding")..offset("key.sliding") + 2], keys.sliding[..]);
        let script = &*crate::scripts::RESERVE_SOURCE;
        assert!(script.contains(&format!("KEYS[e.base + {}]", offset("key.answers"))), "written in as numbers");
        assert!(!script.contains("KEY_ANSWERS"), "no name is left in the script");
    }

    /// A key's burst: a lean event whose keys and record are the last lean one's but for its
    /// message and cost is written as `=`, the same first key, its answer field and its cost, with
    /// no keys of its own; another key's keys are added and its record written the same way. On
    /// the general path (a budgeted event, a drain's heads) the same holds with `~`, which also
    /// carries the answers minute and the key's place in its fair budget's ring.
    #[test]
    fn a_key_s_burst_is_written_once_and_then_by_message() {
        use std::sync::Arc;
        let limits = [Limit::new(10, 1_000, Window::Fixed(Placement::Start)).unwrap()];
        let budget = Arc::new(drip_core::budgets::Budget::named("b", "b", limits.to_vec()));
        let budgets = [budget];
        let request = |key: &'static str, id: &'static str, cost: u64, budgeted: bool| {
            let event = ReserveRequest::new(id, &limits, 0);
            let event = ReserveRequest { cost, budgets: if budgeted { &budgets[..] } else { &[] }, ..event };
            SlotRequest::new("r", key, event)
        };
        let encode = |paths: ReservePaths, requests: &[SlotRequest<'_>]| {
            let mut call = ReserveArgs::new(None).with_paths(paths);
            for r in requests {
                call.event("drip", &EntityKeys::new("drip", r.rule_ref(), r.key, r.event.message_id, None, &limits), r);
            }
            call
        };
        let burst = [request("k", "m1", 1, false), request("k", "m2", 3, false), request("j", "m3", 1, false)];
        let call = encode(ReservePaths::Lean, &burst);
        let modes: Vec<&[u8]> = call.events.iter().map(|e| e.values().next().expect("a value")).collect();
        assert_eq!(modes, [&b"1"[..], b"=", b"="], "the later events are the first's but for their message");
        assert_eq!(value_of(&call.events[0], "event.mode"), b"lean");
        assert_eq!(value_of(&call.events[1], "event.cost"), b"3");
        let first_keys: Vec<&[u8]> = call.events.iter().map(|e| value_of(e, "event.first_key")).collect();
        assert_eq!(first_keys, [&b"1"[..], b"1", b"4"], "the burst's keys once, then the other key's");
        assert_eq!(call.keys.len(), 6);
        assert!(call.events[1..].iter().all(|e| e.len() == 4));
        let general = encode(ReservePaths::General, &burst);
        assert_eq!(value_of(&general.events[0], "event.mode"), b"");
        let marks: Vec<&[u8]> = general.events.iter().map(|e| e.values().next().expect("a value")).collect();
        assert_eq!(marks, [&b"1"[..], b"~", b"~"]);
        assert_eq!(general.keys.len(), 6, "the burst's keys once, then the other key's");
        let named: Vec<(&str, &[u8])> = general.events[2].named().collect();
        assert_eq!(
            named,
            [
                ("event.alike", &b"~"[..]),
                ("event.first_key", b"4"),
                ("event.answer_field", value_of(&general.events[2], "event.answer_field")),
                ("event.cost", b"1"),
                ("event.answers_base", value_of(&general.events[0], "event.answers_base")),
                ("event.body", b""),
            ]
        );
        // A fair budget's drain: each head of another key carries its place in the ring.
        let fair = Arc::new(drip_core::budgets::Budget {
            fair: Some(drip_core::fair::Fair::default()),
            ..(*budgets[0]).clone()
        });
        let fair = [fair];
        let head = |key: &'static str, id: &'static str| {
            let event = ReserveRequest { budgets: &fair[..], ..ReserveRequest::new(id, &limits, 0) };
            SlotRequest { unpark: Some(500), ..SlotRequest::new("r", key, event) }
        };
        let drain = encode(ReservePaths::Lean, &[head("k", "m1"), head("j", "m2")]);
        assert_eq!(value_of(&drain.events[0], "event.mode"), b"unpark");
        assert_eq!(value_of(&drain.events[1], "budget.ring_member"), b"r\nj");
        assert_eq!(drain.events[1].len(), 7);
        assert!(drain.events[0].len() > 40, "written in full once: {}", drain.events[0].len());
        // Records that differ in more than that are written in full.
        let mixed = encode(ReservePaths::Lean, &[request("k", "m1", 1, true), head("k", "m2")]);
        assert!(mixed.events.iter().all(|e| e.values().next() != Some(&b"~"[..])));
    }
}
