//! A fair budget through the real local stack: the limiter (Pub/Sub emulator pushes), Redis, the
//! Cloud Tasks stand-in, the dispatcher draining the budget's ring, and a partner URL.

use std::collections::{BTreeMap, HashMap, HashSet};

use drip_core::time::{Millis, wall_clock_millis};
use drip_tests::unique;

#[path = "support/partner.rs"]
mod partner;
use partner::{
    ThrottledStack, at_most_per_second_and_nothing_dead_lettered, delivered_once, quota_target, stack_before,
};

const FAIR_RULES: &str = r#"
default_dlq_topic: {p}-dlq
budgets:
  {p}-payouts-api:
    limits: [ { limit: 20, per: 1s } ]
    fair: true
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [ { limit: 1000, per: 1s } ]
    budgets: [{p}-payouts-api]
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: { url: "TARGET" }
    overflow_topic: {p}-overflow
    overflow: { url: "TARGET" }
"#;

/// One merchant floods a fair budget of 20 a second with 160 payouts (8 s of the budget; half
/// too large for their queue entries, so that its key's queue holds both kinds); two
/// seconds later three quiet merchants publish 2 each. First come, first served, they would wait
/// behind the flood (~6 s); with `fair: true` each quiet payout reaches the partner within 2.5 s
/// of its publish, the noisy merchant keeps at least half of each window while they wait, the
/// flood is through at about the budget's rate, no second at the partner holds more than 20, and
/// every payout arrives exactly once with nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_merchant_is_not_kept_waiting_behind_a_flood_in_a_fair_budget() {
    quiet_merchants_behind_a_flood(FAIR_RULES, "", 160).await;
}

/// The same with the budget leased over three partitions and a flood of 320: each partition's
/// drain shares what its home leases it among its own waiting keys, and the home shares each
/// window max-min fair among the partitions by what they want of it (a drain leases no window past
/// its deadline, so the flood's partition never holds the next window before the quiet ones ask):
/// each quiet payout within 2.5 s of its publish too, every window exact, the flood at about the
/// budget's rate, every payout once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_merchant_is_not_kept_behind_a_flood_in_a_leased_fair_budget() {
    let rules = FAIR_RULES.replace("    fair: true\n", "    fair: true\n    leases: { partitions: 3 }\n");
    assert_ne!(rules, FAIR_RULES);
    quiet_merchants_behind_a_flood(&rules, "@", 320).await;
}

/// `rings`: how the budget's rings are named in its metrics' target after its name (`@` and a
/// partition on a leased budget); `noisy_count`: the flood's payouts.
async fn quiet_merchants_behind_a_flood(rules: &str, rings: &str, noisy_count: usize) {
    const BUDGET: usize = 20;
    let prefix = unique("fair");
    let ThrottledStack { pubsub, answers, source, dispatcher, _limiter: limiter, namespace, .. } =
        stack_before(&prefix, rules, quota_target(10_000).await, 2).await;
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);

    let mut noisy = HashSet::new();
    let flood_from = wall_clock_millis();
    for i in 0..noisy_count {
        // Two payouts in four are large, their bodies kept beside their queue entries, not in them:
        // one's data alone is over what a call carries, the other's task body only (built before
        // its call, which did not carry it).
        let pad = match i % 4 {
            3 => "x".repeat(drip_store::MAX_BODY_KEPT_IN_CALL),
            1 => "x".repeat(drip_store::MAX_BODY_KEPT_IN_CALL - 200),
            _ => String::new(),
        };
        let data = format!(r#"{{"merchant":"noisy","n":{i},"pad":"{pad}"}}"#);
        noisy.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;

    // Mid-flood, inspect shows the noisy merchant waiting in the budget's ring, alone, with all
    // of each window while it is, and its parked backlog through in about its size at the rate.
    // On a loaded machine the pushes may not have parked anything yet at two seconds: inspect is
    // read again until they have (the flood lasts eight).
    let url = format!("{}/v1/rules/{prefix}-payouts/keys/merchant_noisy", limiter.url);
    let mut report = inspected(&url).await;
    for _ in 0..20 {
        if report["budgets"][0]["fair"]["waitingKeys"] != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        report = inspected(&url).await;
    }
    let fair = &report["budgets"][0]["fair"];
    assert_eq!(fair["waitingKeys"], 1, "{report}");
    assert_eq!(fair["busiest"][0]["key"], "merchant_noisy", "{report}");
    assert_eq!(fair["share"], 1.0, "{report}");
    let parked = fair["busiest"][0]["parked"].as_u64().unwrap_or(0);
    assert!(parked > 0 && parked <= noisy_count as u64, "{report}");
    let expected = fair["expectedWaitMs"].as_i64().unwrap_or(0);
    assert_eq!(expected, parked as i64 * 1_000 / BUDGET as i64, "{report}");
    // Its queue holds entries that keep their bodies and, for the large payouts, entries of a
    // name alone (their bodies beside them).
    let mut connection = drip_tests::redis_server::shared_connection().await;
    let queues: Vec<String> =
        redis::AsyncCommands::keys(&mut connection, format!("{namespace}:*merchant_noisy*:q")).await.unwrap();
    let entries: Vec<Vec<u8>> = redis::AsyncCommands::lrange(&mut connection, &queues[0], 0, -1).await.unwrap();
    let in_entry = entries.iter().filter(|e| e.first() == Some(&0)).count();
    assert!(in_entry > 0 && in_entry < entries.len(), "{in_entry} of {} entries keep their bodies", entries.len());
    // Both kinds of large payout are names alone: about half of a run of payouts (a few pushes
    // may come out of order).
    let alone = entries.len() - in_entry;
    assert!(2 * alone + 4 >= entries.len(), "{alone} of {} entries are names alone", entries.len());
    let mut quiet: HashMap<String, Millis> = HashMap::new();
    for i in 0..6 {
        let data = format!(r#"{{"merchant":"quiet{}","n":{i}}}"#, i % 3);
        let at = wall_clock_millis();
        quiet.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await, at);
    }
    let ids: HashSet<String> = noisy.iter().chain(quiet.keys()).cloned().collect();
    let all = delivered_once(&pubsub, &answers, &prefix, &ids, HashSet::new()).await;
    at_most_per_second_and_nothing_dead_lettered(&pubsub, &prefix, &all, BUDGET).await;
    let delivered: HashMap<&String, Millis> = all.iter().filter(|a| a.2 == 204).map(|a| (&a.0, a.1)).collect();

    let waits: Vec<Millis> = quiet.iter().map(|(id, published)| delivered[id] - published).collect();
    println!("quiet payouts at the partner after their publish: {waits:?} ms");
    let flood_done = noisy.iter().map(|id| delivered[id]).max().unwrap();
    assert!(waits.iter().all(|&w| w <= 2_500), "each quiet payout within 2.5 s: {waits:?} ms");

    // In the seconds (the budget's windows) from the quiet merchants' first publish to their last
    // delivery, the noisy one keeps at least as much as they get.
    let quiet_from = quiet.values().min().unwrap().div_euclid(1_000);
    let quiet_to = quiet.keys().map(|id| delivered[id]).max().unwrap().div_euclid(1_000);
    let meanwhile = |ids: &HashSet<String>| {
        let within = |at: Millis| (quiet_from..=quiet_to).contains(&at.div_euclid(1_000));
        ids.iter().filter(|id| delivered.get(id).is_some_and(|&at| within(at))).count()
    };
    let quiet_ids: HashSet<String> = quiet.keys().cloned().collect();
    let (noisy_then, quiet_then) = (meanwhile(&noisy), meanwhile(&quiet_ids));
    assert!(noisy_then >= quiet_then, "the noisy merchant is never starved: {noisy_then} noisy, {quiet_then} quiet");

    // Work conserving: the flood goes at about the budget's rate (a second of slack for the
    // start, one for the quiet payouts' share, one for the stand-in's timing).
    let allowed = ((noisy_count + quiet.len()).div_ceil(BUDGET) * 1_000 + 3_000) as Millis;
    assert!(flood_done - flood_from <= allowed, "the flood took {} ms (at most {allowed})", flood_done - flood_from);
    let metrics = dispatcher.state.metrics.shared.render();
    assert!(metrics.contains("outcome=\"drained\""), "the budget's ring was drained: {metrics}");
    let booked = format!("drip_fair_booked_units_total{{target=\"budget:{prefix}-payouts-api{rings}");
    let units: u64 = metrics
        .lines()
        .filter_map(|line| line.strip_prefix(&booked)?.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
        .sum();
    assert!(units > 0 && units <= (noisy_count + quiet.len()) as u64, "{units} booked by the drains");

    // Every drained payout's hand-over took it off its key's handing list (whose entry keeps its
    // body), so no list is left: each goes once empty. The last hand-overs may follow the
    // partner's call by a moment.
    let mut left: Vec<String> = Vec::new();
    for _ in 0..50 {
        left = redis::AsyncCommands::keys(&mut connection, format!("{namespace}:*:h")).await.unwrap();
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "handing lists left after every payout was delivered: {left:?}");
}

/// Two merchants flood a fair budget of 20 a second, one with 60 live and 60 bulk payouts (a rule
/// with classes: two members of the ring), the other with 120 bulk: each class waits in its own
/// queue, and a merchant's waiting classes share its weight, so while both backlogs last each
/// merchant gets about half of every window (the first one's split between its classes), not
/// two thirds for the merchant with more classes waiting. Every window exact, every payout once,
/// nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merchant_s_classes_share_its_turn_in_a_fair_budget() {
    const BUDGET: usize = 20;
    let rules = FAIR_RULES.replace(
        "    budgets: [{p}-payouts-api]\n",
        "    budgets: [{p}-payouts-api]\n    classes: { from: \"{attributes.priority}\", default: bulk, reserve: { live: 0.1 } }\n",
    );
    assert_ne!(rules, FAIR_RULES);
    let prefix = unique("fair-classes");
    let ThrottledStack { pubsub, answers, source, .. } =
        stack_before(&prefix, &rules, quota_target(10_000).await, 2).await;
    let mut of: HashMap<String, (&str, &str, usize)> = HashMap::new();
    let started = wall_clock_millis();
    for i in 0..120 {
        let sends = [("two", if i % 2 == 0 { "live" } else { "bulk" }), ("one", "bulk")];
        for (merchant, class) in sends {
            let attributes = BTreeMap::from([
                ("event_type".to_owned(), "payout".to_owned()),
                ("priority".to_owned(), class.to_owned()),
            ]);
            let data = format!(r#"{{"merchant":"{merchant}","n":{i}}}"#);
            of.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await, (merchant, class, i));
        }
    }
    let ids: HashSet<String> = of.keys().cloned().collect();
    let all = delivered_once(&pubsub, &answers, &prefix, &ids, HashSet::new()).await;
    at_most_per_second_and_nothing_dead_lettered(&pubsub, &prefix, &all, BUDGET).await;
    let delivered: Vec<(Millis, &str, &str, usize)> = all
        .iter()
        .filter(|a| a.2 == 204)
        .map(|(id, at, _)| {
            let (merchant, class, n) = of[id];
            (*at, merchant, class, n)
        })
        .collect();
    // From the third second to the eighth both backlogs last (each merchant's 120 at about 10 a
    // second): count what each got.
    let from = started.div_euclid(1_000) + 2;
    let within = |d: &&(Millis, &str, &str, usize)| (from..from + 6).contains(&d.0.div_euclid(1_000));
    let count = |merchant: &str, class: Option<&str>| {
        delivered.iter().filter(within).filter(|d| d.1 == merchant && class.is_none_or(|c| d.2 == c)).count()
    };
    let (two, one) = (count("two", None), count("one", None));
    println!("in six windows: merchant two {two} ({} live), merchant one {one}", count("two", Some("live")));
    assert!(two + one >= 6 * BUDGET * 9 / 10, "the budget kept busy: {two} + {one}");
    assert!(two.abs_diff(one) * 5 <= two + one, "each merchant about half: two {two}, one {one}");
    let live = count("two", Some("live"));
    assert!(live * 3 >= two && live * 3 <= 2 * two, "two's classes share its half: {live} live of {two}");
}

/// Every key a parked key and its fair budget write expires, and none before its messages may
/// still wait (a message's answer is kept `answers_keep` of its `max_delay`): the queue, the
/// key's state, the parked bodies and the budget's ring outlive that from the latest park, also when the queue
/// emptied (and so went) and fills again; the list a drain hands over through expires too. (The
/// ring's drain hash, one per fair budget, is kept: its loss would arm a second wake.)
#[tokio::test]
async fn what_a_parked_key_writes_expires_but_not_while_its_messages_may_wait() {
    use drip_core::schedule::{Status, Unpark};
    use drip_core::time::{MINUTE, SECOND};
    use drip_store::args::answers_keep;
    use drip_store::{ParkedBody, RedisStore, SlotRequest, Store};
    use drip_tests::redis_server::shared_connection;
    use redis::AsyncCommands;

    const T0: Millis = 1_800_000_000_000;
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let id = unique("parked-ttl");
    let rules = one_per_second_fair(&id);
    let rule = rules.rule(&id).unwrap();
    let keep = answers_keep(rule.max_delay);
    let lives = |connection: &mut redis::aio::MultiplexedConnection| {
        let mut connection = connection.clone();
        let id = id.clone();
        async move {
            // (A parked body's key ends with its message's answer field: bytes.)
            let keys: Vec<Vec<u8>> = connection.keys(format!("*{id}*")).await.unwrap();
            let mut lives = BTreeMap::new();
            for key in keys {
                let life: i64 = connection.pttl(&key).await.unwrap();
                lives.insert(String::from_utf8_lossy(&key).into_owned(), life);
            }
            lives
        }
    };
    // Five messages at `now`: the first books near, the last two (past the near horizon) park.
    let park_five = |now: Millis, first: usize| {
        let store = &store;
        async move {
            let mut parked = Vec::new();
            for i in first..first + 5 {
                let message = format!("m{i}");
                let request =
                    SlotRequest::for_rule(rule, "k", &message, 1).at(now).keeping_if_parked(message.as_bytes());
                let status = store.reserve(&request).await.unwrap().reservation.status;
                assert!(i > first || status == Status::Reserved, "at {now}: the first books near");
                if status == Status::Parked {
                    parked.push(message);
                }
            }
            assert!(parked.len() >= 2 && parked.contains(&format!("m{}", first + 4)), "at {now}: {parked:?}");
            let bodies = store.parked_bodies(rule, "k", 10).await.unwrap();
            let kept: Vec<ParkedBody> =
                parked.iter().map(|m| ParkedBody { body: m.clone().into_bytes(), in_entry: true }).collect();
            assert_eq!(bodies.into_iter().flatten().collect::<Vec<_>>(), kept, "at {now}: the queue's entries");
            parked
        }
    };
    let check = |lives: &BTreeMap<String, i64>, least: Millis, at: &str| {
        for suffix in [":q", ":state", &format!(":fair:{id}-api")] {
            let (key, life) =
                lives.iter().find(|(k, _)| k.ends_with(suffix)).unwrap_or_else(|| panic!("{suffix}: {lives:?}"));
            assert!(*life >= least, "{at}: {key} lives {life} ms, less than the {least} its messages may wait");
        }
        // The parked messages' bodies, kept by the calls that parked them in their queue entries
        // (so for as long as the queue): no key of their own.
        assert!(!lives.keys().any(|k| k.contains(":q:")), "{at}: a body kept beside its entry: {lives:?}");
        for (key, life) in lives.iter().filter(|(key, _)| !key.ends_with(&format!(":fair:{id}-api:m"))) {
            assert!(*life > 0 && *life <= 2 * keep + 2 * MINUTE, "{at}: {key} lives {life} ms");
        }
    };
    let parked = park_five(T0, 0).await;
    check(&lives(&mut connection).await, keep - SECOND, "after the first parks");

    // The key's drain, well past the budget's windows: each leaves the queue, which goes.
    for message in &parked {
        let request = SlotRequest { unpark: Some(T0 + MINUTE), ..SlotRequest::for_rule(rule, "k", message, 1) };
        let (unpark, _) = store.unpark(&request.at(T0 + 10 * SECOND)).await.unwrap();
        assert!(matches!(unpark, Unpark::Decided(r) if r.status == Status::Reserved), "{message}: {unpark:?}");
    }
    let drained = lives(&mut connection).await;
    assert!(!drained.keys().any(|k| k.ends_with(":q")), "the queue emptied: {drained:?}");
    let handing = drained.iter().find(|(k, _)| k.ends_with(":h")).expect("the list handed over");
    assert!(*handing.1 > 0, "the list handed over expires: {handing:?}");
    for message in &parked {
        let request =
            SlotRequest { parked_body: Some(message.as_bytes()), ..SlotRequest::for_rule(rule, "k", message, 1) };
        store.handed_over(&request).await.unwrap();
    }
    assert!(!lives(&mut connection).await.keys().any(|k| k.ends_with(":h")), "every entry handed over left its list");

    // Half an hour on, the queue fills again (a new list) while the state says it is kept long
    // enough: the new list is given the life the state records.
    let later = T0 + 30 * MINUTE;
    park_five(later, 5).await;
    check(&lives(&mut connection).await, keep - SECOND, "after the queue filled again");
}

/// The limiter's inspect report at `url`. Inspect reads about 45,000 answer hashes, and a Redis
/// shared with heavy tests may keep it past the limiter's response timeout: a 503 is asked again,
/// a few times.
async fn inspected(url: &str) -> serde_json::Value {
    for _ in 0..5 {
        let response = reqwest::get(url).await.unwrap();
        if response.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return response.json().await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    panic!("inspect stayed unavailable: {url}")
}

/// A rule `id` of 100 a second per key drawing from a fair budget of 1 a second, `max_delay` 4 h.
/// A parked message whose answer is gone (its drain stopped for longer than its max_delay and
/// the margin) still leaves from the head of its queue, its body kept in its entry: with
/// max_delay_exceeded, for the drain to dead-letter; one behind it is not at the head until then,
/// and its hand-over empties the list of those handed over.
#[tokio::test]
async fn a_parked_message_whose_answer_is_gone_leaves_from_the_head_as_too_late() {
    use drip_core::schedule::{Status, Unpark};
    use drip_core::time::MINUTE;
    use drip_store::{ParkedBody, RedisStore, SlotRequest, Store};
    use drip_tests::redis_server::shared_connection;
    use redis::AsyncCommands;

    const T0: Millis = 1_800_000_000_000;
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let id = unique("answer-gone");
    let rules = one_per_second_fair(&id);
    let rule = rules.rule(&id).unwrap();
    let mut parked = Vec::new();
    for i in 0..5 {
        let message = format!("m{i}");
        let request = SlotRequest::for_rule(rule, "k", &message, 1).at(T0).keeping_if_parked(message.as_bytes());
        if store.reserve(&request).await.unwrap().reservation.status == Status::Parked {
            parked.push(message);
        }
    }
    assert!(parked.len() >= 2, "{parked:?}");
    let answers: Vec<String> = connection.keys(format!("*{id}*:a:*")).await.unwrap();
    assert!(!answers.is_empty(), "the parked messages' answers");
    let _: () = connection.del(&answers).await.unwrap();

    let at = T0 + 10 * MINUTE;
    let unpark = |i: usize| {
        let request = SlotRequest { unpark: Some(at + MINUTE), ..SlotRequest::for_rule(rule, "k", &parked[i], 1) };
        let store = &store;
        async move { store.unpark(&request.at(at)).await.unwrap().0 }
    };
    assert_eq!(unpark(1).await, Unpark::NotHead, "behind the head");
    let too_late = |unpark: Unpark| matches!(unpark, Unpark::Decided(r) if r.status == Status::MaxDelayExceeded);
    let head = unpark(0).await;
    assert!(too_late(head), "the head, its answer gone: {head:?}");
    let handing = store.handing(rule, "k").await.unwrap();
    assert_eq!(handing, [Some(ParkedBody { body: parked[0].clone().into_bytes(), in_entry: true })]);
    let body = handing[0].as_ref().unwrap();
    store.handed_over(&body.handed_over(SlotRequest::for_rule(rule, "k", &parked[0], 1))).await.unwrap();
    assert!(store.handing(rule, "k").await.unwrap().is_empty(), "handed over");
    let next = unpark(1).await;
    assert!(too_late(next), "the next head: {next:?}");
}

/// A parking call keeps a body of at most `MAX_BODY_KEPT_IN_CALL` bytes in its message's queue
/// entry; a larger one it does not carry, and its caller keeps it beside the entry, as the
/// limiter's parking does. Both kinds drain in their queue's order with their bodies, and their
/// hand-overs leave no list and no body behind. Redis and the model alike.
#[tokio::test]
async fn a_parking_call_keeps_a_small_body_in_its_entry_and_its_caller_a_large_one_beside_it() {
    use drip_core::schedule::{Status, Unpark};
    use drip_core::time::{HOUR, MINUTE, SECOND};
    use drip_store::{MAX_BODY_KEPT_IN_CALL, MemoryStore, ParkedBody, RedisStore, SlotRequest, Store};
    use drip_tests::redis_server::shared_connection;
    use redis::AsyncCommands;

    const T0: Millis = 1_800_000_000_000;
    let mut connection = shared_connection().await;
    let redis = RedisStore::new(connection.clone(), "drip");
    let id = unique("body-size");
    let rules = one_per_second_fair(&id);
    let rule = rules.rule(&id).unwrap();
    let sizes = [10, MAX_BODY_KEPT_IN_CALL + 1, MAX_BODY_KEPT_IN_CALL, 4 * MAX_BODY_KEPT_IN_CALL, 10];
    let bodies: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![b'a' + i as u8; n]).collect();
    for store in [&redis as &dyn Store, &MemoryStore::new()] {
        let mut parked = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            let message = format!("m{i}");
            let request = SlotRequest::for_rule(rule, "k", &message, 1).at(T0).keeping_if_parked(body);
            let reserved = store.reserve(&request).await.unwrap();
            if reserved.reservation.status != Status::Parked {
                continue;
            }
            assert_eq!(reserved.body_kept(&request), body.len() <= MAX_BODY_KEPT_IN_CALL, "{message}");
            if !reserved.body_kept(&request) {
                store.park_body(&request, body, 5 * HOUR).await.unwrap();
            }
            parked.push((message, ParkedBody { body: body.clone(), in_entry: body.len() <= MAX_BODY_KEPT_IN_CALL }));
        }
        let kinds: Vec<bool> = parked.iter().map(|(_, body)| body.in_entry).collect();
        assert!(kinds.contains(&true) && kinds.contains(&false), "both kinds parked: {kinds:?}");
        let read = store.parked_bodies(rule, "k", 10).await.unwrap();
        let expected: Vec<Option<ParkedBody>> = parked.iter().map(|(_, body)| Some(body.clone())).collect();
        assert_eq!(read, expected, "the queue's bodies, in order");

        for (message, body) in &parked {
            let request = SlotRequest { unpark: Some(T0 + MINUTE), ..SlotRequest::for_rule(rule, "k", message, 1) };
            let (unpark, _) = store.unpark(&request.at(T0 + 10 * SECOND)).await.unwrap();
            assert!(matches!(unpark, Unpark::Decided(r) if r.status == Status::Reserved), "{message}: {unpark:?}");
            assert_eq!(store.handing(rule, "k").await.unwrap(), [Some(body.clone())], "{message} being handed over");
            store.handed_over(&body.handed_over(SlotRequest::for_rule(rule, "k", message, 1))).await.unwrap();
            assert!(store.handing(rule, "k").await.unwrap().is_empty(), "{message} handed over");
        }
    }
    let left: Vec<Vec<u8>> = connection.keys(format!("*{id}*:q*")).await.unwrap();
    assert!(
        left.is_empty(),
        "no queue and no body left: {:?}",
        left.iter().map(|k| String::from_utf8_lossy(k)).collect::<Vec<_>>()
    );
}

fn one_per_second_fair(id: &str) -> drip_core::rules::RuleSet {
    let text = format!(
        "default_dlq_topic: dlq\nbudgets:\n  {id}-api:\n    limits: [ {{ limit: 1, per: 1s }} ]\n    fair: true\nrules:\n  \
         - name: {id}\n    key: \"{{attributes.k}}\"\n    limits: [ {{ limit: 100, per: 1s }} ]\n    budgets: [{id}-api]\n    \
         max_delay: 4h\n    forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
    );
    drip_core::rules::RuleSet::parse("parked.yaml", &text).unwrap()
}

/// The call that parks a key's message in a fair budget arms the ring's drain when none is armed,
/// at the slot less the near horizon (no earlier than now): the next parks, of the key or another,
/// find it armed and arm nothing, nor does a redelivery; a wake armed longer ago than
/// `WAKE_LOST_AFTER` (its task was lost) is armed again. The model and Redis alike.
#[tokio::test]
async fn a_parking_call_arms_its_ring_s_drain_once_and_again_when_the_wake_is_lost() {
    use drip_core::schedule::{Status, WAKE_LOST_AFTER};
    use drip_store::{MemoryStore, RedisStore, SlotRequest, Store};
    use drip_tests::redis_server::shared_connection;

    const T0: Millis = 1_800_000_000_000;
    let id = unique("armed");
    let rules = one_per_second_fair(&id);
    let rule = rules.rule(&id).unwrap();
    let near = rule.fair_budget().and_then(|b| b.near()).expect("a fair budget");
    let redis = RedisStore::new(shared_connection().await, "drip");
    let mut runs = Vec::new();
    for store in [&redis as &dyn Store, &MemoryStore::new()] {
        let mut arms = Vec::new();
        let sends = [("a", "a0", T0), ("a", "a1", T0), ("a", "a2", T0), ("b", "b0", T0), ("a", "a2", T0 + 1)];
        let later = T0 + WAKE_LOST_AFTER + 10 * drip_core::time::SECOND;
        for (key, message, now) in sends.into_iter().chain([("b", "b1", later), ("b", "b2", later)]) {
            let reserved = store.reserve(&SlotRequest::for_rule(rule, key, message, 1).at(now)).await.unwrap();
            if reserved.reservation.status == Status::Parked {
                arms.push((message, reserved.armed.then(|| reserved.ring_wake(near))));
            }
        }
        runs.push(arms);
    }
    let armed: Vec<_> = runs[0].iter().filter_map(|(m, wake)| wake.map(|w| (*m, w))).collect();
    assert_eq!(armed.len(), 2, "armed at the first park and once the wake was lost: {:?}", runs[0]);
    assert!(armed[0].1 >= T0 && armed[0].1 <= T0 + drip_core::schedule::MAX_WAKE_GAP, "{armed:?}");
    assert!(armed[1].0.starts_with('b') && armed[1].1 >= T0 + WAKE_LOST_AFTER, "re-armed late: {armed:?}");
    assert_eq!(runs[0], runs[1], "Redis and the model");
}
