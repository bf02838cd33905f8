//! What both stores file and read back: answers by minute, the backlog and its inspect rows, the
//! common path's one read and one write, and what earlier layouts and rule edits left behind.

use super::*;

/// Answers are filed by id and minute of publication in both stores: m1 published at 12:00:59, an
/// m1 published at 12:01:00 and m2 at 12:01:01 under 1 a minute are three messages for both; a
/// message's redelivery in a later minute (its publish time unchanged) finds its answer.
#[test]
fn both_stores_file_answers_by_the_minute_of_publication() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let noon = T0 - T0 % (60 * MINUTE) + 12 * 60 * MINUTE;
    let arrival = |id: &str, now: Millis, published: Millis, redelivery: bool| Arrival {
        entity: 0,
        id: id.into(),
        cost: 1,
        now,
        published,
        redelivery,
        reslot: None,
        floor: None,
        class: 0,
        unclassed: false,
    };
    let (t0, t1, t2) = (noon + 59 * SECOND, noon + MINUTE, noon + MINUTE + SECOND);
    let scenario = Scenario {
        limits: vec![Limit::new(1, MINUTE, Window::Fixed(Placement::Start)).unwrap()],
        max_delay: 10 * MINUTE,
        events: vec![
            arrival("m1", t0, t0, false),
            arrival("m1", t1, t1, true),
            arrival("m2", t2, t2, false),
            arrival("m1", t2 + 3 * MINUTE, t0, true),
        ],
        overrides: Vec::new(),
        edit: None,
        pauses: Vec::new(),
        shared: Default::default(),
    };
    let rule = unique("filing");
    let memory = MemoryStore::new();
    let (model, lua) = runtime
        .block_on(async { (run(&memory, &rule, &scenario, &[]).await, run(&redis, &rule, &scenario, &[]).await) });
    assert_eq!(model, lua);
    let slots: Vec<Millis> = lua.iter().map(|r| r.slot).collect();
    assert_eq!(slots, [t0, noon + MINUTE, noon + 2 * MINUTE, t0]);
    assert!(lua[3].replayed(), "{:?}", lua[3]);
}

/// `examples/payouts.yaml`'s payouts rule (three fixed limits), under an id of its own.
fn example_payouts_rule(prefix: &str) -> drip_core::rules::Rule {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/payouts.yaml");
    let rules = drip_core::rules::RuleSet::load(std::path::Path::new(path)).unwrap();
    let mut rule = rules.rule("payouts").unwrap().clone();
    rule.id = unique(prefix);
    rule
}

/// `inspect`'s backlog is exact whatever the limits: 350 payouts into `examples/payouts.yaml`
/// (three fixed limits, 10 a second binding first) leave 340 waiting, and both stores say
/// exactly how many hold a slot after the moment they report, as the reservations themselves
/// do. They also say why a new event would wait: the full limit, with when its window ends.
#[test]
fn both_stores_count_the_backlog_exactly_and_say_why_a_key_waits() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rule = example_payouts_rule("exact");
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let memory = MemoryStore::new();
    for store in [&redis as &dyn Store, &memory] {
        let published = drip_core::time::wall_clock_millis();
        let mut slots = Vec::new();
        for i in 0..350 {
            let id = format!("p{i}");
            let request = SlotRequest::for_rule(&rule, "merchant_7", &id, 1).published(Some(published));
            let reserved = runtime.block_on(store.reserve(&request)).unwrap();
            runtime.block_on(store.complete(&request, &reserved)).unwrap();
            slots.push(reserved.reservation.slot);
        }
        let report = runtime.block_on(store.inspect(&rule, "merchant_7")).unwrap();
        let now = drip_core::time::parse_rfc3339(&report.now).unwrap();
        let ahead = slots.iter().filter(|&&slot| slot > now).count() as u64;
        assert!(ahead >= 330, "about 340 wait: {ahead}");
        assert_eq!(report.backlog, ahead, "{store:?}: exactly the events whose slot is after {}", report.now);
        let again = runtime
            .block_on(store.reserve(&SlotRequest::for_rule(&rule, "merchant_7", "p0", 1).published(Some(published))));
        assert_eq!(again.unwrap().reservation.slot, slots[0], "a redelivery changes nothing");
        assert!(runtime.block_on(store.inspect(&rule, "merchant_7")).unwrap().backlog <= ahead, "nothing added");
        assert!(
            report.waiting_on.iter().any(|w| w.starts_with("10 per 1s (fixed): full (10 of 10) until")
                || w.starts_with("100 per 1m (fixed): full (100 of 100) until")),
            "{:?}",
            report.waiting_on
        );
    }
}

/// Every row `inspect` prints is exact or a range holding the truth: after a burst, a pause and
/// more events behind it, each limit's use now and cost ahead (counted here from the slots the
/// reservations returned) lie within what both stores report, and rows a state keeps exactly
/// (a window still current, a sliding log) are exact. While a pause holds the backlog, it drains
/// after the pause, not at its old last slot.
#[test]
fn inspect_rows_are_exact_or_ranges_that_hold_the_truth() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Booked behind the pause, not parked (a parked event holds no slot to count).
    let rule = drip_core::rules::Rule { park_horizon: None, ..example_payouts_rule("rows") };
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let memory = MemoryStore::new();
    for store in [&redis as &dyn Store, &memory] {
        let published = drip_core::time::wall_clock_millis();
        let mut slots = Vec::new();
        let reserve = |ids: std::ops::Range<usize>, slots: &mut Vec<Millis>| {
            for i in ids {
                let id = format!("e{i}");
                let request = SlotRequest::for_rule(&rule, "merchant_9", &id, 1).published(Some(published));
                let reserved = runtime.block_on(store.reserve(&request)).unwrap();
                runtime.block_on(store.complete(&request, &reserved)).unwrap();
                slots.push(reserved.reservation.slot);
            }
        };
        reserve(0..30, &mut slots);
        let pause_end = drip_core::time::wall_clock_millis() + 10 * MINUTE;
        runtime.block_on(store.pause(&rule, "merchant_9", pause_end)).unwrap();
        let held = runtime.block_on(store.inspect(&rule, "merchant_9")).unwrap();
        assert_eq!(held.drains_at, None, "{store:?}: {held:?}");
        assert_eq!(
            held.drains_after.as_deref().map(|at| drip_core::time::parse_rfc3339(at).unwrap() / SECOND),
            Some(pause_end / SECOND),
            "{store:?}: the backlog drains after the pause"
        );
        reserve(30..55, &mut slots);
        let report = runtime.block_on(store.inspect(&rule, "merchant_9")).unwrap();
        let now = drip_core::time::parse_rfc3339(&report.now).unwrap();
        assert_eq!(report.backlog, slots.iter().filter(|&&s| s > now).count() as u64);
        assert!(
            report.drains_at.is_some() && report.drains_after.is_none(),
            "{store:?}: the last slot is after the pause"
        );
        for (limit, row) in rule.limits.iter().zip(&report.limits) {
            let current = now.div_euclid(limit.per()) * limit.per();
            let used = slots.iter().filter(|&&s| s >= current && s < current + limit.per()).count() as u64;
            let ahead = slots.iter().filter(|&&s| s >= current + limit.per()).count() as u64;
            let within = |least: u64, most: Option<u64>, truth: u64| match most {
                None => least == truth,
                Some(most) => least <= truth && truth <= most,
            };
            assert!(within(row.used_now, row.used_now_at_most, used), "{store:?} {}: used {used}: {row:?}", row.limit);
            assert!(within(row.ahead, row.ahead_at_most, ahead), "{store:?} {}: ahead {ahead}: {row:?}", row.limit);
            assert!(row.ahead <= report.backlog.max(ahead), "{store:?}: no row says more is ahead than waits: {row:?}");
        }
    }
}

/// The common path is the token bucket's: one read of the entity's state (its limits, overrides,
/// pause and adaptive level in one hash) and one write of it, plus the message's answer, written
/// with HSETNX so that knowing whether the message is new costs no read of its own. Counted from
/// Redis's commandstats on a private server, for a plain entity and for one with an override and a
/// pause; a redelivery adds the one read of its answer.
#[tokio::test]
async fn the_common_path_reads_the_entity_once_and_writes_it_once() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [Limit::new(1_000, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request = |id: &str, key: &'static str, now: Millis| {
        let event = ReserveRequest { published: Some(T0), lease: 10 * SECOND, ..ReserveRequest::new("", &limits, now) };
        (id.to_owned(), SlotRequest::new("r", key, event).at(now))
    };
    let reserve = async |(id, mut request): (String, SlotRequest<'_>)| {
        request.event.message_id = &id;
        store.reserve(&request).await.unwrap().reservation
    };
    let overridden = drip_core::schedule::LimitOverride { limit: 500, until: None };
    let rule = plain_rule("r", &limits);
    store.clock().set(T0);
    store.change_override(&rule, "busy", &limits[0], Some(overridden), "test".into()).await.unwrap();
    store.pause(&rule, "busy", T0 + 10).await.unwrap();
    for key in ["plain", "busy"] {
        // The first event of the entity and of the minute sets the expiries; the next ones do not.
        reserve(request("first", key, T0 + 20)).await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        for i in 0..10 {
            let reserved = reserve(request(&format!("m{i}"), key, T0 + 30 + i)).await;
            assert_eq!(reserved.attempt, drip_core::schedule::Attempt::Decided);
        }
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
        let expected: BTreeMap<String, u64> = [("hmget", 10), ("hsetnx", 10), ("hset", 10)]
            .into_iter()
            .map(|(name, calls)| (name.to_owned(), calls))
            .collect();
        assert_eq!(script_commands(&stats), expected, "{key}: ten events, each one read and two writes");
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        let again = reserve(request("m3", key, T0 + 50)).await;
        assert_eq!((again.attempt, again.slot), (drip_core::schedule::Attempt::Busy, T0 + 33));
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
        let commands = script_commands(&stats);
        assert_eq!((commands.get("hsetnx"), commands.get("hget"), commands.get("hset")), (Some(&1), Some(&1), None));
    }
}

/// A rolling deploy: an entity as the earlier layout left it (its frontier 'last', its overrides
/// and pause in a hash of their own, a message's answer in the minute's answers hash), then
/// reserved by this version. The old message's redelivery gets its answer and consumes nothing;
/// a new message keeps FIFO, the override and the pause; the entity is carried over to the new
/// layout (its overrides in its state hash, the old hash gone) and lives as long as they matter.
#[tokio::test]
async fn an_entity_the_earlier_layout_wrote_keeps_its_answers_and_overrides() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let rule = unique("layout");
    let limits = [Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request =
        |id: &'static str, now: Millis| SlotRequest::new(&rule, "k", ReserveRequest::new(id, &limits, now)).at(now);
    let old = request("old", T0);
    let keys = store.keys(&old);
    let window = state_id(&limits[0]);
    // As the earlier version wrote it: "old" reserved at T0 + 1 s (leased until T0 + 11 s).
    let slot = T0 + SECOND;
    let answer =
        format!("R{}:{}:{}", slot - keys.answers_base, T0 - keys.answers_base, T0 + 11 * SECOND - keys.answers_base);
    let _: () = connection.hset(&keys.answers, &keys.answer_field[..], answer).await.unwrap();
    let (used_window, used) = (format!("{window}:w"), format!("{window}:u"));
    let state = [
        ("last", slot.to_string()),
        ("exp", (slot + 10 * MINUTE).to_string()),
        ("ab", keys.answers_base.to_string()),
        (used_window.as_str(), slot.to_string()),
        (used.as_str(), "1".to_owned()),
    ];
    let _: () = connection.hset_multiple(&keys.state, &state).await.unwrap();
    let _: () = connection.pexpire(&keys.state, 10 * MINUTE).await.unwrap();
    let legacy = [("fixed:1000", "1".to_owned()), ("pause", (T0 + 3 * SECOND).to_string())];
    let _: () = connection.hset_multiple(&keys.legacy_overrides, &legacy).await.unwrap();
    let before = store.entity_state(RuleRef::plain(&rule), "k", &limits).await.unwrap();
    assert_eq!(before.last_slot, Some(slot), "the earlier frontier is read back");
    assert_eq!(before.paused_until, Some(T0 + 3 * SECOND), "and the earlier overrides");

    let redelivered = store.reserve(&request("old", T0 + 20 * SECOND)).await.unwrap().reservation;
    assert_eq!((redelivered.slot, redelivered.decided_at), (slot, T0), "the first answer, replayed");
    assert_eq!(redelivered.attempt, drip_core::schedule::Attempt::Resumed, "its lease had ended");
    assert_eq!(store.entity_state(RuleRef::plain(&rule), "k", &limits).await.unwrap(), before, "nothing consumed");

    let new = [request("new1", T0 + 100), request("new2", T0 + 200)];
    let slots: Vec<Millis> = store.reserve_batch(&new).await.unwrap().iter().map(|r| r.reservation.slot).collect();
    assert_eq!(slots, [T0 + 3 * SECOND, T0 + 4 * SECOND], "after the pause, one a second (the override)");
    let fields: HashMap<String, String> = connection.hgetall(&keys.state).await.unwrap();
    assert!(!fields.contains_key("last") && fields.contains_key("f"), "carried over: {fields:?}");
    assert!(fields.get("o").is_some_and(|o| o.contains("fixed:1000=1")), "{fields:?}");
    assert!(!connection.exists::<_, bool>(&keys.legacy_overrides).await.unwrap(), "the old hash is gone");
    assert_eq!(connection.pttl::<_, i64>(&keys.state).await.unwrap(), -1, "an override without an end keeps it");
    store.clock().set(T0 + 300);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], None, "test".into()).await.unwrap();
    let ttl: i64 = connection.pttl(&keys.state).await.unwrap();
    assert!(ttl > 0, "the state expires again once no override is for ever: {ttl}");
}

/// An override or a pause keeps the entity's state hash (where it lives) alive until it stops
/// mattering, and no longer than the state's own expiry once it has.
#[tokio::test]
async fn overrides_keep_the_state_alive_as_long_as_they_matter() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let rule = unique("keep");
    let limits = [Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let now = drip_core::time::wall_clock_millis();
    let request = SlotRequest::new(&rule, "k", ReserveRequest::new("m", &limits, now)).at(now);
    store.reserve(&request).await.unwrap();
    let state = store.keys(&request).state;
    let own: i64 = connection.pttl(&state).await.unwrap();
    assert!(own > 0 && own <= 2 * (SECOND + drip_store::STATE_MARGIN) + SECOND, "{own}");
    let until = now + 3 * drip_core::time::HOUR;
    let set = drip_core::schedule::LimitOverride { limit: 1, until: Some(until) };
    store.clock().set(now);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], Some(set), "test".into()).await.unwrap();
    let kept: i64 = connection.pttl(&state).await.unwrap();
    assert!(kept >= until - now + drip_store::OVERRIDE_MARGIN - SECOND, "until the override's end and a day: {kept}");
    // Another reservation does not cut it short.
    store.reserve(&SlotRequest::new(&rule, "k", ReserveRequest::new("m2", &limits, now)).at(now)).await.unwrap();
    assert!(connection.pttl::<_, i64>(&state).await.unwrap() >= kept - SECOND);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], None, "test".into()).await.unwrap();
    let back: i64 = connection.pttl(&state).await.unwrap();
    assert!(back > 0 && back <= own + SECOND, "back to the state's own expiry: {back} (was {own})");
}

/// A key's override on a rule with classes is its calendar's: every class of the key books against
/// it (named by the key or by any of its classes), another key keeps the rule's count, and an
/// override without an end keeps the calendar alive through reservations until it is deleted.
#[tokio::test]
async fn an_override_of_a_classed_key_holds_for_every_class_and_keeps_its_calendar() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let id = unique("classed");
    let text = format!(
        "default_dlq_topic: dlq\nrules:\n  - name: {id}\n    key: \"{{attributes.k}}\"\n    limits: [ {{ limit: 2, per: 1h }} ]\n    \
         max_delay: 30d\n    classes: {{ from: \"{{attributes.c}}\", default: bulk, reserve: {{ live: 0.5 }} }}\n    \
         forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
    );
    let rules = drip_core::rules::RuleSet::parse("classed.yaml", &text).unwrap();
    let rule = rules.rule(&id).unwrap();
    let now = drip_core::time::wall_clock_millis();
    store.clock().set(now);
    let forever = drip_core::schedule::LimitOverride { limit: 4, until: None };
    store.change_override(rule, "m#live", &rule.limits[0], Some(forever), "test".into()).await.unwrap();
    assert_eq!(store.overrides(rule, "m").await.unwrap().values().next(), Some(&forever), "the key's, not the class's");
    let slots = |key: &'static str| {
        let store = &store;
        async move {
            let mut slots = Vec::new();
            for (i, class) in ["live", "bulk", "bulk", "live", "bulk"].into_iter().enumerate() {
                let message = format!("{key}{i}");
                let event = ReserveRequest::for_rule(rule, &message, 1, now).for_class(rule, (key, class));
                let entity = format!("{key}#{class}");
                let reserved = store.reserve(&SlotRequest::new(&rule.id, &entity, event).at(now)).await.unwrap();
                slots.push(reserved.reservation.slot.div_euclid(drip_core::time::HOUR));
            }
            slots
        }
    };
    let hour = now.div_euclid(drip_core::time::HOUR);
    assert_eq!(slots("m").await, [hour, hour, hour, hour, hour + 1], "4 an hour for every class of m");
    assert_eq!(slots("n").await, [hour, hour, hour + 1, hour + 1, hour + 2], "2 an hour for n");
    let calendar = drip_store::class_calendar_key("drip", RuleRef::of(rule), "m");
    assert_eq!(connection.pttl::<_, i64>(&calendar).await.unwrap(), -1, "an override without an end keeps it");
    store.change_override(rule, "m", &rule.limits[0], None, "test".into()).await.unwrap();
    let ttl: i64 = connection.pttl(&calendar).await.unwrap();
    assert!(ttl > drip_core::time::HOUR, "it expires again with its windows once the override is gone: {ttl}");
    assert!(store.overrides(rule, "m#bulk").await.unwrap().is_empty());
}

/// A message given a new slot with its old one given back, through both stores: the old slot's
/// unit returns to the budget's window (and the entity's), so the new slot can be in the same
/// window; kept, it cannot. Both stores leave the same state.
#[tokio::test]
async fn a_new_slot_gives_the_old_one_s_units_back_in_both_stores() {
    let redis = RedisStore::new(shared_connection().await, "drip");
    let limits = [Limit::new(5, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let budget = Arc::new(Budget::named(
        unique("gateway"),
        unique("gateway"),
        vec![Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()],
    ));
    let budgets = [budget.clone()];
    for (old, slot, next_window) in [(OldSlot::GivenBack, T0 + 100, None), (OldSlot::Kept, T0 + SECOND, Some(1))] {
        let rule = unique("give-back");
        let memory = MemoryStore::new();
        let request = |id: &'static str, now: Millis, reslot: Option<OldSlot>| {
            let event = ReserveRequest { budgets: &budgets, ..ReserveRequest::new(id, &limits, now) };
            let tag = Some(budget.tag.as_str());
            SlotRequest { reslot, tag, ..SlotRequest::new(&rule, "k", event).at(now) }
        };
        for store in [&redis as &dyn Store, &memory] {
            assert_eq!(store.reserve(&request("a", T0, None)).await.unwrap().reservation.slot, T0);
            assert_eq!(store.reserve(&request("b", T0, None)).await.unwrap().reservation.slot, T0);
            let again = store.reserve(&request("a", T0 + 100, Some(old))).await.unwrap().reservation;
            assert_eq!(again.slot, slot, "{old:?}");
        }
        let tagged = RuleRef { id: &rule, tag: Some(&budget.tag), leases: None, classed: false };
        let in_redis = redis.entity_state(tagged, "k", &limits).await.unwrap();
        assert_eq!(Some(&in_redis), memory.entity_state(&rule, "k").as_ref(), "{old:?}");
        let shared = redis.budget_state(&budget).await.unwrap();
        let windows = (shared.windows.get(&(SECOND, T0)).copied(), shared.windows.get(&(SECOND, T0 + SECOND)).copied());
        assert_eq!(windows, (Some(2), next_window), "{old:?}: the budget's windows");
        assert_eq!(Some(&shared), memory.budget_state(&budget.name).as_ref(), "{old:?}");
        // The next test case starts the budget afresh.
        let mut connection = shared_connection().await;
        let _: () = connection.del(drip_store::budget_key("drip", &budget)).await.unwrap();
    }
}

/// A budget added to a rule with keys already booked, through both stores: a message reserved
/// before took nothing from it, so a new slot or a lowered cost gives it nothing back and a
/// raised cost charges it nothing (the budget's full window stays full: the new slot goes to the
/// next); lost and gained again, a message reserved in the gap likewise. The key's lean events
/// (no budget) and its budgeted ones (the general path) leave the same state in both stores.
#[tokio::test]
async fn a_budget_added_to_a_rule_gets_back_only_what_its_slots_took_in_both_stores() {
    let redis = RedisStore::new(shared_connection().await, "drip");
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let budget = Arc::new(Budget::named(
        unique("gateway"),
        unique("gateway"),
        vec![Limit::new(3, SECOND, Window::Fixed(Placement::Start)).unwrap()],
    ));
    let budgets = [budget.clone()];
    let rule = unique("budget-added");
    let memory = MemoryStore::new();
    // (key, message, now, cost, whether the rule has the budget, whether it is a new slot)
    let request = |key: &'static str, id: &'static str, now: Millis, cost: u64, budgeted: bool, reslot: bool| {
        let on = if budgeted { &budgets[..] } else { &[] };
        let event = ReserveRequest { cost, budgets: on, ..ReserveRequest::new(id, &limits, now) };
        let reslot = reslot.then_some(OldSlot::GivenBack);
        SlotRequest { tag: Some(budget.tag.as_str()), reslot, ..SlotRequest::new(&rule, key, event).at(now) }
    };
    let used = |state: drip_core::schedule::BudgetState| state.windows.get(&(SECOND, T0)).copied();
    for store in [&redis as &dyn Store, &memory] {
        macro_rules! slot {
            ($($request:expr),*) => {
                store.reserve(&request($($request),*)).await.unwrap().reservation.slot
            };
        }
        for (id, cost) in [("a0", 1), ("a1", 2), ("a2", 1)] {
            assert_eq!(slot!("a", id, T0, cost, false, false), T0);
        }
        for id in ["b0", "b1", "b2"] {
            assert_eq!(slot!("b", id, T0 + 1, 1, true, false), T0 + 1);
        }
        assert_eq!(slot!("a", "a0", T0 + 2, 1, true, true), T0 + SECOND, "the window stays full");
        let corrected = store.correct_cost(&request("a", "a1", T0 + 3, 1, true, false), 0).await.unwrap();
        assert_eq!(corrected, Correction::Applied { booked: 2, actual: 0 });
        let corrected = store.correct_cost(&request("a", "a2", T0 + 3, 1, true, false), 3).await.unwrap();
        assert_eq!(corrected, Correction::Applied { booked: 1, actual: 3 });
        assert_eq!(slot!("b", "b2", T0 + 4, 1, true, true), T0 + 4, "b2 took its unit");
        // c: budgeted, then a lean event in a gap, then budgeted again.
        assert_eq!(slot!("c", "c0", T0 + 5, 1, true, false), T0 + SECOND);
        assert_eq!(slot!("c", "c1", T0 + 6, 1, false, false), T0 + SECOND);
        assert_eq!(slot!("c", "c2", T0 + 7, 1, true, false), T0 + SECOND);
        assert_eq!(slot!("c", "c1", T0 + 8, 1, true, true), T0 + 2 * SECOND, "a0, c0 and c2 fill the window");
    }
    let in_redis = redis.budget_state(&budget).await.unwrap();
    assert_eq!(used(in_redis.clone()), Some(3));
    assert_eq!(in_redis.windows.get(&(SECOND, T0 + SECOND)).copied(), Some(3));
    assert_eq!(Some(&in_redis), memory.budget_state(&budget.name).as_ref());
    let tagged = RuleRef { id: &rule, tag: Some(&budget.tag), leases: None, classed: false };
    for key in ["a", "b", "c"] {
        let state = redis.entity_state(tagged, key, &limits).await.unwrap();
        assert_eq!(Some(&state), memory.entity_state(&rule, key).as_ref(), "{key}");
    }
}

/// reserve.lua runs as a function library (FCALL): a Redis that never held it, or lost it (a
/// FUNCTION FLUSH, a new instance), gets it loaded by the first reservation that misses it, and the
/// reservation goes on as if nothing happened.
#[tokio::test]
async fn a_redis_that_lost_the_library_loads_it_again() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [Limit::new(1, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let reserve = async |id: &str| {
        let request = SlotRequest::new("r", "k", ReserveRequest::new(id, &limits, T0)).at(T0);
        store.reserve(&request).await.unwrap().reservation.slot
    };
    assert_eq!(reserve("m1").await, T0, "loaded on a Redis that never held it");
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query_async(&mut connection).await.unwrap();
    assert_eq!(libraries.len(), 1, "one library: {libraries:?}");
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut connection).await.unwrap();
    assert_eq!(reserve("m2").await, T0 + SECOND, "loaded again, the entity's state intact");
}

/// Classes added to a rule that parks while a key has events parked: the key's drain, its
/// requests made as the dispatcher makes them (`SlotRequest::for_rule` of the rule as it is now),
/// books them as the key's default class against its calendar, so a window holds the classes'
/// events and the drained ones within its count; both stores give every answer alike.
#[tokio::test]
async fn what_a_key_parked_before_its_rule_had_classes_drains_as_its_default_class() {
    // A key may hold a `#` itself (a template renders what the event holds): its bare entity is
    // still its own, not a class of the part before the `#`.
    for key in ["m", "m#1"] {
        parked_then_classed(key).await;
    }
}

async fn parked_then_classed(key: &str) {
    use drip_core::rules::RuleSet;
    let redis = RedisStore::new(shared_connection().await, "drip");
    let id = unique("parked-then-classed");
    let text = |classes: &str| {
        format!(
            "default_dlq_topic: dlq\nrules:\n  - name: {id}\n    key: \"{{attributes.k}}\"\n    limits: [ {{ limit: 3, per: 1s }} ]\n    \
             max_delay: 1h\n    park_horizon: 1s\n{classes}    forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
        )
    };
    let before = RuleSet::parse("before.yaml", &text("")).unwrap();
    let classes = "    classes: { from: \"{attributes.c}\", default: bulk, reserve: { live: 0.34 } }\n";
    let after = RuleSet::parse("after.yaml", &text(classes)).unwrap();
    let (before, after) = (before.rule(&id).unwrap(), after.rule(&id).unwrap());
    let parked: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    let (mut answers, memory) = (Vec::new(), MemoryStore::new());
    redis.clock().set(T0);
    memory.clock().set(T0);
    for store in [&redis as &dyn Store, &memory] {
        let mut slots = Vec::new();
        // The key is paused until 5 s: its events park (the later ones behind the first).
        store.pause(before, key, T0 + 5 * SECOND).await.unwrap();
        for message in &parked {
            let request = SlotRequest::for_rule(before, key, message, 1).at(T0 + 100);
            assert_eq!(store.reserve(&request).await.unwrap().reservation.status, Status::Parked);
        }
        // The rule gains classes: the key's classes fill the window at 6 s.
        for (message, class) in [("b0", "bulk"), ("b1", "bulk"), ("l0", "live")] {
            let entity = drip_core::rules::Classes::entity(key, class);
            let reserved = store.reserve(&SlotRequest::for_rule(after, &entity, message, 1).at(T0 + 6 * SECOND)).await;
            let reservation = reserved.unwrap().reservation;
            assert_eq!(reservation.status, Status::Reserved);
            slots.push(reservation.slot);
        }
        // The key's drain at 6 s, as the rule is now, books its parked events within 3 s.
        let mut drained = Vec::new();
        for message in &parked {
            let request =
                SlotRequest { unpark: Some(T0 + 9 * SECOND), ..SlotRequest::for_rule(after, key, message, 1) };
            let (unpark, _) = store.unpark(&request.at(T0 + 6 * SECOND)).await.unwrap();
            let Unpark::Decided(reservation) = unpark else { panic!("{key} {message}: {unpark:?}") };
            assert_eq!(reservation.status, Status::Reserved, "{message}");
            drained.push(reservation.slot);
        }
        assert!(drained.iter().all(|&slot| slot >= T0 + 7 * SECOND), "after the classes' full window: {drained:?}");
        slots.extend(&drained);
        let mut per_window = BTreeMap::new();
        for slot in &slots {
            *per_window.entry(slot.div_euclid(SECOND)).or_insert(0) += 1;
        }
        assert!(per_window.values().all(|&n| n <= 3), "every window of the key within 3: {per_window:?}");
        // A pause of the bare key, as the rule is now, is the one its drain and dispatch read.
        store.pause(after, key, T0 + 20 * SECOND).await.unwrap();
        assert_eq!(store.paused_until(after, key).await.unwrap(), Some(T0 + 20 * SECOND), "{key}");
        let request = SlotRequest::for_rule(after, key, "late", 1).at(T0 + 10 * SECOND);
        let parked = store.reserve(&request).await.unwrap().reservation;
        assert_eq!(parked.status, Status::Parked, "{key}: behind its pause");
        // The busiest keys count the bare key and its classes as one key, its own.
        let busiest = store.busiest_keys(after, 10, 10_000_000).await.unwrap();
        let keys: Vec<&str> = busiest.keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, [key], "{busiest:?}");
        answers.push(slots);
    }
    assert_eq!(answers[0], answers[1], "{key}: Redis and the model");
}
