use proptest::strategy::{Just, Strategy};

use super::tests::request;
use super::*;
use crate::budgets::{Adaptive, PPM};
use crate::time::SECOND;

fn budget(limit: u64, placement: Placement, max_share: Option<u64>) -> Arc<Budget> {
    Arc::new(Budget {
        name: "gateway".into(),
        limits: vec![Limit::new(limit, SECOND, Window::Fixed(placement)).unwrap()],
        max_share,
        adaptive: None,
        floors: Vec::new(),
        per_key: false,
        fair: None,
        leases: None,
        tag: "gateway".into(),
    })
}

/// A budget of 10 a second leased over two partitions, asking a unit at a time: each partition
/// asks its home when its pool has no room; the home leases it its share of the window's count
/// (a partition that has not asked yet counts as asking as much), and as much of the term's next
/// windows as it then holds of this one; a partition that finds a window leased out books the
/// next windows it holds, asking no more.
#[test]
fn a_leased_budget_s_partitions_book_what_their_home_leased_them() {
    let leases = crate::budgets::Leases { partitions: 2, chunk: 100_000 };
    let budgets = [Arc::new(Budget { leases: Some(leases), ..(*budget(10, Placement::Start, None)).clone() })];
    let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
    let (p0, p1) = (in_partition(0), in_partition(1));
    let mut s = Scheduler::new();
    let slots: Vec<Millis> = (0..12)
        .map(|i| reserve(&mut s, if i % 2 == 0 { &p0 } else { &p1 }, &format!("m{i}"), 0, &budgets).slot)
        .collect();
    // p0 leases 5 of window 0 (half: p1, not asking yet, counts as asking as much) and 5 of each
    // of the term's next windows; p1 the other 5, and 5 ahead. Each finds window 0 leased out at
    // its sixth event, asks, and is told so: the home stops at window 1, which it holds a lease of.
    assert_eq!(slots, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, SECOND, SECOND]);
    let (home, term) = (s.budget_state("gateway").unwrap(), lease_term(SECOND));
    assert!(term > 1, "a lease of a 1 s limit covers more than its window");
    assert_eq!(home.windows, (0..term).map(|w| ((SECOND, w * SECOND), 10)).collect());
    assert_eq!(home.granted.get(&(SECOND, 0, 0)), Some(&5));
    assert_eq!(home.granted.get(&(SECOND, 0, 1)), Some(&5));
    assert_eq!(home.granted.get(&(SECOND, (term - 1) * SECOND, 1)), Some(&5));
    let pool = s.budget_state(&budgets[0].pool_name(1)).unwrap();
    assert_eq!(pool.known_full.get(&SECOND), Some(&0), "p1 knows window 0 is leased out");
    assert_eq!((pool.windows.get(&(SECOND, SECOND)), pool.leased.get(&(SECOND, SECOND))), (Some(&1), Some(&5)));
    // Its next events book what it holds, without asking.
    let more: Vec<Millis> = (12..16).map(|i| reserve(&mut s, &p1, &format!("m{i}"), 0, &budgets).slot).collect();
    assert_eq!(more, [SECOND; 4]);
    assert_eq!(s.budget_state("gateway").unwrap().windows.len(), term as usize, "no lease since");
    // A window's units: what a partition asks for, or its share of the count by demand, less what
    // it holds, if more.
    let mut home = BudgetState::default();
    let grant = |home: &mut BudgetState, partition, want, horizon| {
        let leases = home.grant((partition, 2, 0), (SECOND, 0, horizon), 10, (1, want), lease_term(SECOND));
        leases.iter().map(|l| (l.window, l.total)).collect::<Vec<_>>()
    };
    assert_eq!(grant(&mut home, 0, 2, 0), [(Some(0), 5)], "half: p1, not asking yet, counts as asking 2");
    assert_eq!(grant(&mut home, 1, 1, 0), [(Some(0), 4)], "its share (1 of 3) of 10, rounded up");
    assert_eq!(grant(&mut home, 1, 8, 0), [(Some(0), 5)], "asked 8: the 1 left");
    assert_eq!(grant(&mut home, 0, 8, 0), [(None, 0)], "nothing left up to the horizon");
    // Ahead, each of the term's next windows: as much as it holds of the first (its rate), at most
    // its share, less what it holds there.
    let mut home = BudgetState::default();
    let ahead = |w: Millis, total| (Some(w * SECOND), total);
    let first: Vec<_> =
        std::iter::once(ahead(0, 10)).chain((1..lease_term(SECOND).min(3)).map(|w| ahead(w, 5))).collect();
    assert_eq!(grant(&mut home, 0, 10, 2 * SECOND), first, "all of window 0, as asked; ahead its share, half");
    assert_eq!(
        grant(&mut home, 1, 1, 2 * SECOND),
        [ahead(1, 1), ahead(2, 1)],
        "window 0 is leased out: the next with room, its share (1 of 11) of it"
    );
    assert_eq!(
        grant(&mut home, 1, 4, 2 * SECOND),
        [ahead(1, 5), ahead(2, 3)],
        "4 more of window 1; ahead up to its share (4 of 14: 3)"
    );
    assert_eq!(
        grant(&mut home, 1, 1, 2 * SECOND),
        [(None, 0)],
        "windows 0 and 1 are full and it holds a lease of window 1: told so, nothing leased"
    );
    // A window of a long limit (one whose term is that window alone): what it asks for.
    let mut home = BudgetState::default();
    let minute = home.grant((0, 2, 0), (crate::time::MINUTE, 0, 0), 100, (1, 2), lease_term(crate::time::MINUTE));
    assert_eq!((minute[0].window, minute[0].total), (Some(0), 2));
    // A pause of a leased budget is its home's: both partitions wait.
    s.pause_budget("gateway", 5 * SECOND);
    assert_eq!(reserve(&mut s, &p0, "late", 0, &budgets).slot, 5 * SECOND);
}

/// A partition that leased a whole window gives what left it back to the home (an event
/// reslotted, its old slot given back), and the other partition leases it: without the return
/// it would find the window leased out and take the next.
#[test]
fn a_partition_gives_back_what_left_its_lease_and_another_leases_it() {
    let leases = crate::budgets::Leases { partitions: 2, chunk: crate::budgets::PPM };
    let budgets = [Arc::new(Budget { leases: Some(leases), ..(*budget(10, Placement::Start, None)).clone() })];
    let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
    let (p0, p1) = (in_partition(0), in_partition(1));
    let mut s = Scheduler::new();
    let slots: Vec<Millis> = (0..4).map(|i| reserve(&mut s, &p0, &format!("m{i}"), 0, &budgets).slot).collect();
    assert_eq!(slots, [0; 4]);
    assert_eq!(s.budget_state("gateway").unwrap().granted.get(&(SECOND, 0, 0)), Some(&10), "the whole window");
    // Two of p0's events leave window 0 (their task found a pause, say): their units go back.
    for (id, now) in [("m1", 100), ("m2", 150)] {
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let request = ReserveRequest { max_delay: 10 * SECOND, budgets: &budgets, ..request(id, &limits, now) };
        s.reslot("r", &p0, &request, OldSlot::GivenBack);
    }
    let pool = s.budget_state(&budgets[0].pool_name(0)).unwrap();
    assert_eq!(pool.returned.get(&(SECOND, 0)), Some(&2), "{pool:?}");
    assert_eq!(pool.pool_holds(SECOND, 0), 8);
    let home = s.budget_state("gateway").unwrap();
    assert_eq!(home.windows.get(&(SECOND, 0)), Some(&8), "the home leased 10 and took 2 back");
    assert_eq!(home.taken_back.get(&(SECOND, 0, 0)), Some(&2));
    // What they gave back went home; their new slots are in what p0 still held, at now.
    assert_eq!(pool.windows.get(&(SECOND, 0)), Some(&4), "m0, m3 and the two reslotted");
    // p1 leases the 2 that came back in window 0.
    assert_eq!(reserve(&mut s, &p1, "n0", 200, &budgets).slot, 200);
    assert_eq!(
        s.budget_state("gateway").unwrap().granted.get(&(SECOND, 0, 1)),
        Some(&2),
        "both: p0 holds more than its part"
    );
    // A return told twice takes nothing more back.
    let mut home = s.budget_state("gateway").unwrap().clone();
    let before = home.windows.get(&(SECOND, 0)).copied();
    assert_eq!(home.take_back(0, (SECOND, 0), 2), 0);
    assert_eq!(home.windows.get(&(SECOND, 0)).copied(), before);
}

/// A limit whose window lies in a nearly full window of a longer limit of its budget (less left
/// at the home than two terms of its count) leases one window at a time, only what it asks for,
/// as a long limit does; beside a longer window with room to spare, a term's windows with its
/// share.
#[test]
fn a_limit_in_a_nearly_full_longer_window_leases_one_window_as_asked() {
    let minute = crate::time::MINUTE;
    let mut home = BudgetState::default();
    home.windows.insert((minute, minute), 1_500);
    let short = |window, need| nearly_full_around(&home, (SECOND, window), vec![(minute, 2_000)], need);
    assert!(short(minute + 5 * SECOND, 1_200), "500 left of the minute, two terms of 300 a second 1,200");
    assert!(!short(minute + 5 * SECOND, 500), "500 left is enough for 500");
    assert!(!short(5 * SECOND, 600), "another minute: nothing leased of it");
    assert!(!nearly_full_around(&home, (SECOND, minute), [], 600), "no longer limit");

    let leases = crate::budgets::Leases { partitions: 2, chunk: 250_000 };
    let first_lease = |limits: Vec<Limit>| {
        let budget = Budget { leases: Some(leases), limits, ..(*budget(10, Placement::Start, None)).clone() };
        let budgets = [Arc::new(budget)];
        let key = (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == 0).unwrap();
        let mut s = Scheduler::new();
        assert_eq!(reserve(&mut s, &key, "m", 0, &budgets).slot, 0);
        let home = s.budget_state("gateway").unwrap().clone();
        home.granted.iter().filter(|((per, _, _), _)| *per == SECOND).map(|(&(_, w, _), &n)| (w, n)).collect::<Vec<_>>()
    };
    let second = Limit::new(10, SECOND, Window::Fixed(Placement::Start)).unwrap();
    let per_minute = |n| Limit::new(n, minute, Window::Fixed(Placement::Start)).unwrap();
    let alone = first_lease(vec![second]);
    assert_eq!(alone.len() as i64, lease_term(SECOND), "alone: a term's windows: {alone:?}");
    assert_eq!(alone[0], (0, 5), "its share of window 0 (the other partition counts as asking as much)");
    assert_eq!(first_lease(vec![second, per_minute(100)]), alone, "a minute with room: as alone");
    let tight = first_lease(vec![second, per_minute(35)]);
    assert_eq!(tight, [(0, 3)], "35 a minute, less than two terms of 10 a second: window 0, as asked");
}

/// A budget of 10 a second and 8T per 2T seconds (T, a single 1 s limit's term:
/// `lease_term(1 s)` seconds), over two partitions. Both limits go as asked, a chunk at a time
/// (the seconds nest in the long window). p1 took a chunk of the long window and books it, so its
/// next event goes to the next long window: the 1 s units it holds of the first and cannot book
/// go back to the home, and p0, which holds long units but has booked its own seconds, leases them
/// instead of booking later seconds. The long window fills.
#[test]
fn a_partition_past_a_long_window_gives_up_its_seconds_there_for_one_that_can_book_them() {
    let term = lease_term(SECOND);
    let (long, n) = (2 * term * SECOND, |k: i64| usize::try_from(k * term).unwrap());
    let leases = crate::budgets::Leases { partitions: 2, chunk: 250_000 };
    let limits = vec![
        Limit::new(10, SECOND, Window::Fixed(Placement::Start)).unwrap(),
        Limit::new(8 * term as u64, long, Window::Fixed(Placement::Start)).unwrap(),
    ];
    let budgets = [Arc::new(Budget { leases: Some(leases), limits, ..(*budget(10, Placement::Start, None)).clone() })];
    let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
    let (p0, p1) = (in_partition(0), in_partition(1));
    let mut s = Scheduler::new();
    let book = |s: &mut Scheduler, key: &str, from: usize, n: usize| -> Vec<Millis> {
        (from..from + n).map(|i| reserve(s, key, &format!("m{i}"), 0, &budgets).slot).collect()
    };
    assert_eq!(book(&mut s, &p1, 0, 1), [0]);
    let first = book(&mut s, &p0, 1, n(5));
    assert!(first.iter().all(|&t| t < term * SECOND), "p0 books its half of the first T seconds: {first:?}");
    let p1_slots = book(&mut s, &p1, 1 + n(5), n(2));
    assert!(p1_slots[..n(2) - 1].iter().all(|&t| t < term * SECOND), "{p1_slots:?}");
    assert_eq!(p1_slots[n(2) - 1], long, "p1 booked its chunk of the long window and the home leased it all");
    let p1_pool = s.budget_state(&budgets[0].pool_name(1)).unwrap().clone();
    let seconds = || (0..2 * term).map(|w| (SECOND, w * SECOND));
    let given: u64 = seconds().filter_map(|w| p1_pool.returned.get(&w)).sum();
    let unbooked: u64 = seconds()
        .map(|w| p1_pool.leased.get(&w).copied().unwrap_or(0) - p1_pool.windows.get(&w).copied().unwrap_or(0))
        .sum();
    assert!(given > 0 && given == unbooked, "all it held of the first long window and had not booked: {p1_pool:?}");
    assert_eq!(p1_pool.given_up.get(&long), Some(&0), "the first long window is given up once");
    // p0 has booked its seconds and holds long units: it leases the seconds p1 gave up.
    let rest = book(&mut s, &p0, 1 + n(7), n(1));
    assert!(rest.iter().all(|&t| t < term * SECOND), "{rest:?}");
    let booked = |p: u32| s.budget_state(&budgets[0].pool_name(p)).unwrap().windows.get(&(long, 0)).copied();
    assert_eq!(booked(0).unwrap_or(0) + booked(1).unwrap_or(0), 8 * term as u64, "the long window is full");
    let home = s.budget_state("gateway").unwrap();
    assert!((0..2 * term).all(|w| home.windows.get(&(SECOND, w * SECOND)).is_none_or(|&n| n <= 10)));

    // A partition told the first seconds were full asks only past them: a grant also leases it up
    // to what it asks of the first window with room from the earliest given back since, if its
    // pool can still book there (its reach), and the mark moves there.
    let mut home = BudgetState::default();
    home.grant((1, 2, 0), (SECOND, 0, 9 * SECOND), 10, (1, 10), lease_term(SECOND));
    home.windows.extend((1..5).map(|w| ((SECOND, w * SECOND), 10)));
    assert_eq!(home.take_back(1, (SECOND, 0), 4), 4);
    assert_eq!(home.reopened.get(&SECOND), Some(&0));
    let reopened = |home: &mut BudgetState, reach| {
        home.lease_reopened((0, 0), (SECOND, 5 * SECOND, reach), 10, (1, 3)).map(|l| (l.window, l.total))
    };
    assert_eq!(reopened(&mut home, SECOND), None, "p0 can book nothing before second 1");
    assert_eq!(home.reopened.get(&SECOND), Some(&0), "the mark stays for the others");
    assert_eq!(reopened(&mut home, 0), Some((Some(0), 3)), "what it asks for, of the 4");
    assert_eq!(reopened(&mut home, 0), Some((Some(0), 4)), "the last one");
    assert_eq!(home.reopened.get(&SECOND), Some(&0));
    assert_eq!(reopened(&mut home, 0), None, "nothing left before second 5");
    assert_eq!(home.reopened.get(&SECOND), None, "the mark goes");
}

/// An adaptive leased budget: a signal goes to the home, which hands its level to both pools;
/// each gives back what it leased and had not booked of every window still open, so that the
/// home's next grants, at the lowered count, bind from now on (as on one Redis).
#[test]
fn a_lowered_level_of_a_leased_budget_takes_back_what_its_pools_had_not_booked() {
    let leases = crate::budgets::Leases { partitions: 2, chunk: 100_000 };
    let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 100_000, step: 100_000, latency: None };
    let leased =
        Budget { leases: Some(leases), adaptive: Some(adaptive), ..(*budget(10, Placement::Start, None)).clone() };
    let budgets = [Arc::new(leased)];
    let in_partition = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
    let (p0, p1) = (in_partition(0), in_partition(1));
    let mut s = Scheduler::new();
    // Each partition leases half of window 0 and of the term's next ones, and books one.
    assert_eq!(reserve(&mut s, &p0, "a", 0, &budgets).slot, 0);
    assert_eq!(reserve(&mut s, &p1, "b", 0, &budgets).slot, 0);
    let (home, term) = (s.budget_state("gateway").unwrap(), lease_term(SECOND));
    assert_eq!(home.windows, (0..term).map(|w| ((SECOND, w * SECOND), 10)).collect());

    assert_eq!(s.signal_budget(&budgets[0], 100), Some(500_000));
    let home = s.budget_state("gateway").unwrap().clone();
    for partition in 0..2 {
        let pool = s.budget_state(&budgets[0].pool_name(partition)).unwrap();
        assert_eq!(pool.adaptive, home.adaptive, "the pool reads the home's level");
        assert_eq!(pool.pool_holds(SECOND, 0), 1, "what it booked of window 0 stays");
        assert_eq!(pool.pool_holds(SECOND, SECOND), 0);
    }
    assert_eq!(home.windows.get(&(SECOND, 0)), Some(&2), "the home took back all but the two booked");
    assert_eq!(home.windows.get(&(SECOND, (term - 1) * SECOND)), Some(&0));

    // At the lowered count (5 a second), both partitions together book 5 of each window.
    let slots: Vec<Millis> = (0..16)
        .map(|i| reserve(&mut s, if i % 2 == 0 { &p0 } else { &p1 }, &format!("m{i}"), 200, &budgets).slot)
        .collect();
    let booked = |window: Millis| slots.iter().filter(|&&t| t.div_euclid(SECOND) == window).count();
    assert_eq!(booked(0), 3, "window 0 holds two already: {slots:?}");
    assert!((1..5).all(|w| booked(w) <= 5), "{slots:?}");
    assert_eq!(booked(1) + booked(2) + booked(3), 13, "the rest in the next windows, work-conserving: {slots:?}");
}

/// A drain leases only windows it may book now: its home walks no window past the drain's
/// deadline, and a head whose pool is short past it stays, its slot that window, with nothing
/// leased there (a busy partition's drain never takes a window ahead before the partitions whose
/// keys arrive meanwhile have asked for it).
#[test]
fn a_drain_leases_no_window_past_its_deadline() {
    let leases = crate::budgets::Leases { partitions: 2, chunk: PPM };
    let fair = Some(crate::fair::Fair::default());
    let budgets = [Arc::new(Budget { leases: Some(leases), fair, ..(*budget(10, Placement::Start, None)).clone() })];
    let key = (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == 0).unwrap();
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    fn parking<'a>(
        id: &'a str,
        now: Millis,
        (limits, budgets): (&'a [Limit], &'a [Arc<Budget>]),
    ) -> ReserveRequest<'a> {
        ReserveRequest { max_delay: 10 * SECOND, park: Some(2 * SECOND), budgets, ..request(id, limits, now) }
    }
    let ids: Vec<String> = (0..25).map(|i| format!("m{i}")).collect();
    let request = |i: usize, now| parking(&ids[i], now, (&limits, &budgets));
    let mut s = Scheduler::new();
    // Ten book window 0; the eleventh leases window 1 and parks (past the near horizon), and so
    // does every one after it.
    let statuses: Vec<Status> = (0..25).map(|i| s.reserve("r", &key, &request(i, 0)).status).collect();
    assert_eq!(statuses[..10], [Status::Reserved; 10]);
    assert_eq!(statuses[10..], [Status::Parked; 15]);
    // A drain at 600 books up to 1100: window 1's ten, then its head stays at window 2.
    let deadline = 600 + budgets[0].near().unwrap();
    for i in 10..20 {
        let unpark = s.unpark("r", &key, &request(i, 600), deadline);
        assert!(matches!(unpark, Unpark::Decided(r) if r.slot == SECOND), "m{i}: {unpark:?}");
    }
    let stays = s.unpark("r", &key, &request(20, 600), deadline);
    assert_eq!(stays, Unpark::Later { slot: 2 * SECOND, wake: 2 * SECOND - (deadline - 600) });
    let home = s.budget_state("gateway").unwrap();
    assert_eq!(home.windows.get(&(SECOND, 2 * SECOND)), None, "nothing leased past the deadline: {home:?}");
    // The next drain, with window 2 within its deadline, leases it.
    let unpark = s.unpark("r", &key, &request(20, 1_500), 2_000);
    assert!(matches!(unpark, Unpark::Decided(r) if r.slot == 2 * SECOND), "{unpark:?}");
    assert_eq!(s.budget_state("gateway").unwrap().windows.get(&(SECOND, 2 * SECOND)), Some(&10));
}

/// A fair partition's demand is all it wants of the window it asks from: what it asks for and
/// what it already holds there. One whose pool booked its unit and asks for one more is owed two;
/// the flood's partition takes the rest.
#[test]
fn a_fair_partition_s_demand_counts_what_it_holds_of_the_window() {
    let mut home = BudgetState::default();
    let grant = |home: &mut BudgetState, partition, want, (now, from)| {
        let lease = home.grant_fair((partition, 3, now), (SECOND, from, 3 * SECOND), 20, (1, want));
        (lease.window, lease.total)
    };
    assert_eq!(grant(&mut home, 0, 128, (0, 0)), (Some(0), 20));
    assert_eq!(grant(&mut home, 1, 1, (10, 0)), (Some(SECOND), 1), "window 0 is the flood's");
    assert_eq!(grant(&mut home, 1, 1, (20, SECOND)), (Some(SECOND), 2), "it wants 2 of window 1, not 1");
    assert_eq!(home.demands.get(&(SECOND, 1)), Some(&(2, 20)));
    assert_eq!(grant(&mut home, 0, 128, (30, SECOND)), (Some(SECOND), 18), "the flood: all p1 is not owed");
}

fn reserve(s: &mut Scheduler, key: &str, id: &str, now: Millis, budgets: &[Arc<Budget>]) -> Reservation {
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request = ReserveRequest { max_delay: 10 * SECOND, budgets, ..request(id, &limits, now) };
    s.reserve("r", key, &request)
}

/// A budget added to a rule: a message reserved before (or while the rule was without it)
/// took nothing from it, so a new slot or a lower cost gives it nothing back and a higher
/// cost charges it nothing; one reserved since gives back as before.
#[test]
fn a_slot_reserved_before_its_rule_had_a_budget_gives_that_budget_nothing_back() {
    let budgets = [budget(3, Placement::Start, None)];
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let at =
        |id, now, cost, budgets| ReserveRequest { cost, max_delay: 10 * SECOND, budgets, ..request(id, &limits, now) };
    let used = |s: &Scheduler| s.budget_state("gateway").unwrap().windows.get(&(SECOND, 0)).copied();
    let mut s = Scheduler::new();
    for (id, cost) in [("a0", 1), ("a1", 2), ("a2", 1)] {
        assert_eq!(s.reserve("r", "a", &at(id, 0, cost, &[])).slot, 0);
    }
    // The rule gains the budget: b's three fill its first window.
    for id in ["b0", "b1", "b2"] {
        assert_eq!(s.reserve("r", "b", &at(id, 1, 1, &budgets)).slot, 1);
    }
    assert_eq!(used(&s), Some(3));
    // a0 given a new slot: its old one took nothing from the budget, which stays full.
    assert_eq!(s.reslot("r", "a", &at("a0", 2, 1, &budgets), OldSlot::GivenBack).slot, SECOND);
    assert_eq!(used(&s), Some(3));
    // a1's cost lowered, a2's raised: neither moves the budget.
    assert_eq!(s.correct("r", "a", &at("a1", 3, 1, &budgets), 0), Correction::Applied { booked: 2, actual: 0 });
    assert_eq!(s.correct("r", "a", &at("a2", 3, 1, &budgets), 3), Correction::Applied { booked: 1, actual: 3 });
    assert_eq!(used(&s), Some(3));
    // b2 was reserved with the budget: its new slot gives its unit back first, and takes it again.
    assert_eq!(s.reslot("r", "b", &at("b2", 4, 1, &budgets), OldSlot::GivenBack).slot, 4);
    assert_eq!(used(&s), Some(3));

    // Lost and gained again: a message reserved in the gap gives nothing back either.
    let mut s = Scheduler::new();
    assert_eq!(s.reserve("r", "c", &at("c0", 0, 1, &budgets)).slot, 0);
    assert_eq!(s.reserve("r", "c", &at("c1", 1, 1, &[])).slot, 1);
    assert_eq!(s.reserve("r", "c", &at("c2", 2, 1, &budgets)).slot, 2);
    assert_eq!(used(&s), Some(2));
    assert_eq!(s.reslot("r", "c", &at("c1", 3, 1, &budgets), OldSlot::GivenBack).slot, 3);
    assert_eq!(used(&s), Some(3), "c1 took a unit it had not given back");
}

#[test]
fn entities_share_a_budget_and_a_backlogged_one_does_not_block_the_others() {
    let budgets = [budget(4, Placement::Start, None)];
    let mut s = Scheduler::new();
    let a: Vec<Millis> = (0..10).map(|i| reserve(&mut s, "a", &format!("a{i}"), 0, &budgets).slot).collect();
    assert_eq!(a, [0, 0, 0, 0, 1_000, 1_000, 1_000, 1_000, 2_000, 2_000]);
    // Window 2s holds 2 of a's; b takes the rest of it, then the first free window.
    let b: Vec<Millis> = (0..3).map(|i| reserve(&mut s, "b", &format!("b{i}"), 500, &budgets).slot).collect();
    assert_eq!(b, [2_000, 2_000, 3_000]);
    assert_eq!(s.budget_state("gateway").unwrap().windows[&(SECOND, 2_000)], 4);
}

#[test]
fn a_fair_share_leaves_the_others_room_and_a_paused_budget_waits() {
    let budgets = [budget(10, Placement::Start, Some(300_000))];
    let mut s = Scheduler::new();
    let flood: Vec<Millis> = (0..7).map(|i| reserve(&mut s, "noisy", &format!("n{i}"), 0, &budgets).slot).collect();
    assert_eq!(flood, [0, 0, 0, 1_000, 1_000, 1_000, 2_000], "3 of each window of 10");
    assert_eq!(reserve(&mut s, "quiet", "q", 0, &budgets).slot, 0);
    s.pause_budget("gateway", 5_500);
    assert_eq!(reserve(&mut s, "other", "o", 100, &budgets).slot, 5_500);
}

#[test]
fn spread_places_out_of_order_events_by_what_the_window_holds() {
    let budgets = [budget(4, Placement::Spread, None)];
    let mut s = Scheduler::new();
    let slots: Vec<Millis> =
        (0..5).map(|i| reserve(&mut s, &format!("k{i}"), &format!("m{i}"), 0, &budgets).slot).collect();
    assert_eq!(slots, [0, 250, 500, 750, 1_000]);
}

/// A scheduler whose budgets forget their runs before every search gives the same slots: the
/// runs only speed the search up.
fn without_runs(s: &mut Scheduler) -> &mut Scheduler {
    s.budgets.values_mut().for_each(|b| b.runs.clear());
    s
}

#[test]
fn a_calendar_full_far_ahead_is_walked_once_then_jumped() {
    let budgets = [budget(2, Placement::Start, None)];
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let reserve = |s: &mut Scheduler, key: &str| {
        s.reserve(
            "r",
            key,
            &ReserveRequest { max_delay: 1_000 * SECOND, budgets: &budgets, ..request("m", &limits, 0) },
        )
    };
    let mut s = Scheduler::new();
    // 1,000 tenants fill 500 windows; each search starts at now's window.
    for i in 0..1_000 {
        reserve(&mut s, &format!("k{i}"));
    }
    let run = s.budget_state("gateway").unwrap().runs[&SECOND];
    assert_eq!(run, FullRun { from: 0, through: 498_000, least: 2 }, "the last search walked to window 499");
    let mut plain = s.clone();
    assert_eq!(reserve(&mut s, "new").slot, 500_000);
    assert_eq!(reserve(without_runs(&mut plain), "new").slot, 500_000);
    assert_eq!(s.budget_state("gateway").unwrap().runs[&SECOND].through, 499_000, "extended by the window walked");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    #[test]
    fn runs_of_full_windows_never_change_a_slot(
        events in proptest::collection::vec((0u8..6, 1u64..4, 0i64..4_000, 0u8..3), 1..120),
        count in 2u64..6,
        adaptive_signals in proptest::collection::vec(0usize..120, 0..3),
        floors in proptest::option::of((0u64..=600_000, 0u64..=400_000)),
    ) {
        let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 200_000, step: 100_000, latency: None };
        let budget = Arc::new(Budget {
            limits: vec![
                Limit::new(count, SECOND, Window::Fixed(Placement::Start)).unwrap(),
                Limit::new(count * 3, 5 * SECOND, Window::Fixed(Placement::Spread)).unwrap(),
            ],
            adaptive: Some(adaptive),
            floors: floors.map_or_else(Vec::new, |(r0, r1)| vec![("r0".into(), r0), ("r1".into(), r1)]),
            ..(*budget(count, Placement::Start, None)).clone()
        });
        let budgets = [budget.clone()];
        let own = [Limit::new(3, 2 * SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let (mut fast, mut plain) = (Scheduler::new(), Scheduler::new());
        let mut now = 0;
        for (i, (key, cost, step, margin)) in events.into_iter().enumerate() {
            now += step / 8;
            if adaptive_signals.contains(&i) {
                fast.signal_budget(&budget, now);
                plain.signal_budget(&budget, now);
            }
            let id = format!("m{i}");
            let request = ReserveRequest {
                cost: cost.min(count),
                max_delay: 60 * SECOND,
                budgets: &budgets,
                margin: Millis::from(margin) * 100,
                ..request(&id, &own, now)
            };
            let (rule, key) = (format!("r{}", key % 3), format!("k{key}"));
            let a = fast.reserve(&rule, &key, &request);
            let b = without_runs(&mut plain).reserve(&rule, &key, &request);
            proptest::prop_assert_eq!((a.slot, a.status), (b.slot, b.status), "event {}", i);
        }
    }
}

fn reserve_for(s: &mut Scheduler, rule: &str, id: &str, now: Millis, budgets: &[Arc<Budget>]) -> Millis {
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request = ReserveRequest { max_delay: 10 * SECOND, budgets, ..request(id, &limits, now) };
    s.reserve(rule, "k", &request).slot
}

#[test]
fn a_floor_keeps_its_share_of_each_window_from_a_flood_booked_ahead() {
    let budgets =
        [Arc::new(Budget { floors: vec![("small".into(), 300_000)], ..(*budget(10, Placement::Start, None)).clone() })];
    let mut s = Scheduler::new();
    let flood: Vec<Millis> = (0..40).map(|i| reserve_for(&mut s, "big", &format!("b{i}"), 0, &budgets)).collect();
    // Window 0 has started (its floor is anyone's); later windows keep 3 of 10 for `small`.
    assert_eq!(flood.iter().filter(|&&t| t == 0).count(), 10);
    for window in [1_000, 2_000, 3_000, 4_000] {
        assert_eq!(flood.iter().filter(|&&t| t == window).count(), 7, "window {window}");
    }
    assert_eq!(flood.iter().filter(|&&t| t == 5_000).count(), 2);
    // `small` arrives after the flood and books its floor of the first window that has one.
    let small: Vec<Millis> = (0..4).map(|i| reserve_for(&mut s, "small", &format!("s{i}"), 500, &budgets)).collect();
    assert_eq!(small, [1_000, 1_000, 1_000, 2_000]);
    let state = s.budget_state("gateway").unwrap();
    assert_eq!(state.windows[&(SECOND, 1_000)], 10);
    assert_eq!(state.floor_used[&(SECOND, 2_000, "small".to_owned())], 1);
    // Without the floor, `small` would have waited behind the whole flood.
    let plain = [budget(10, Placement::Start, None)];
    let mut s = Scheduler::new();
    (0..40).for_each(|i| _ = reserve_for(&mut s, "big", &format!("b{i}"), 0, &plain));
    assert_eq!(reserve_for(&mut s, "small", "s0", 500, &plain), 4_000);
}

proptest::proptest! {
    /// Whatever another rule (with or without a floor of its own) booked ahead, a rule whose
    /// floor holds `units` of each window books `units / cost` events into every window that
    /// had not started: its i-th event lies no later than window `1 + i / (units / cost)`.
    #[test]
    fn a_floor_s_rule_books_its_floor_of_every_window_whatever_was_booked_ahead(
        count in 2u64..20,
        (floor, other) in (50_000u64..=PPM).prop_flat_map(|f| (Just(f), 0..=PPM - f)),
        flood in proptest::collection::vec(1u64..4, 0..200),
        small in 1usize..40,
        cost in 1u64..4,
    ) {
        let units = count * floor / PPM;
        proptest::prop_assume!(units >= cost);
        let floors = vec![("small".to_owned(), floor), ("big".to_owned(), other)];
        let budgets = [Arc::new(Budget { floors, ..(*budget(count, Placement::Start, None)).clone() })];
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let mut s = Scheduler::new();
        for (i, c) in flood.iter().enumerate() {
            let id = format!("b{i}");
            let request = ReserveRequest { cost: (*c).min(count), max_delay: 1_000 * SECOND, budgets: &budgets, ..request(&id, &limits, 0) };
            s.reserve("big", "k", &request);
        }
        for i in 0..small {
            let id = format!("s{i}");
            let request = ReserveRequest { cost, max_delay: 1_000 * SECOND, budgets: &budgets, ..request(&id, &limits, 500) };
            let slot = s.reserve("small", "k", &request).slot;
            let bound = (1 + i as u64 / (units / cost)) as Millis * SECOND;
            proptest::prop_assert!(slot <= bound, "event {} at {} after {:?}", i, slot, s.budget_state("gateway"));
        }
        let state = s.budget_state("gateway").unwrap();
        proptest::prop_assert!(state.windows.values().all(|&used| used <= count), "{:?}", state.windows);
    }
}

#[test]
fn a_key_s_floor_is_held_for_that_key_not_for_the_rest_of_its_rule() {
    let budgets = [Arc::new(Budget {
        floors: vec![("sms|vip".into(), 300_000)],
        ..(*budget(10, Placement::Start, None)).clone()
    })];
    let reserve = |s: &mut Scheduler, key: &str, id: &str, now: Millis| {
        let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
        let request = ReserveRequest { max_delay: 10 * SECOND, budgets: &budgets, ..request(id, &limits, now) };
        s.reserve("sms", key, &request).slot
    };
    let mut s = Scheduler::new();
    // Another key of the same rule floods: it leaves `vip`'s 3 units of each later window.
    let flood: Vec<Millis> = (0..24).map(|i| reserve(&mut s, "bulk", &format!("b{i}"), 0)).collect();
    assert_eq!(flood.iter().filter(|&&t| t == 1_000).count(), 7);
    let vip: Vec<Millis> = (0..4).map(|i| reserve(&mut s, "vip", &format!("v{i}"), 500)).collect();
    assert_eq!(vip, [1_000, 1_000, 1_000, 2_000]);
    assert_eq!(s.budget_state("gateway").unwrap().floor_used[&(SECOND, 1_000, "sms|vip".to_owned())], 3);
    // A third key of the rule holds no floor: it waits behind the flood.
    assert_eq!(reserve(&mut s, "other", "o0", 500), 3_000);
}

#[test]
fn an_unused_floor_is_anyone_s_once_its_window_starts() {
    let budgets =
        [Arc::new(Budget { floors: vec![("small".into(), 300_000)], ..(*budget(10, Placement::Start, None)).clone() })];
    let mut s = Scheduler::new();
    (0..38).for_each(|i| _ = reserve_for(&mut s, "big", &format!("b{i}"), 0, &budgets));
    // Before window 1s starts, another rule cannot borrow `small`'s 3 units there: it goes to
    // the first window with room beside the floor (5s, still empty).
    assert_eq!(reserve_for(&mut s, "other", "o0", 900, &budgets), 5_000);
    // Once it has started, they are free to whoever asks first.
    let started: Vec<Millis> =
        (1..5).map(|i| reserve_for(&mut s, "other", &format!("o{i}"), 1_000, &budgets)).collect();
    assert_eq!(started, [5_000, 5_000, 5_000, 5_000], "FIFO: `other`'s next events follow its first");
    assert_eq!(reserve_for(&mut s, "third", "t0", 1_000, &budgets), 1_000);
    assert_eq!(s.budget_state("gateway").unwrap().windows[&(SECOND, 1_000)], 8);
}

/// A rule of 10 a second with classes: `live` reserves 20% of each window. Entities are a key's
/// classes (`<key>#<class>`), each its own FIFO; the key's calendar holds the limit.
fn reserve_class(
    s: &mut Scheduler,
    (key, class): (&str, &str),
    id: &str,
    now: Millis,
    calendar: &Arc<Budget>,
) -> Millis {
    let draws = [calendar.clone()];
    let request =
        ReserveRequest { max_delay: 100 * SECOND, budgets: &draws, class: Some((key, class)), ..request(id, &[], now) };
    s.reserve("payouts", &format!("{key}#{class}"), &request).slot
}

/// A classes calendar of 10 a second per key, `live` reserving 20% of each window.
fn live_reserve_calendar() -> Arc<Budget> {
    Arc::new(Budget {
        name: "payouts".into(),
        floors: vec![("live".into(), 200_000)],
        per_key: true,
        fair: None,
        leases: None,
        ..(*budget(10, Placement::Start, None)).clone()
    })
}

#[test]
fn classes_added_to_a_key_with_a_backlog_book_after_it_and_count_its_last_window() {
    let calendar = live_reserve_calendar();
    let mut s = Scheduler::new();
    // Before the rule had classes, the key's own state booked 25 events: 10, 10 and 5.
    let limits = calendar.limits.clone();
    for i in 0..25 {
        let id = format!("o{i}");
        s.reserve("payouts", "m", &ReserveRequest { max_delay: 100 * SECOND, ..request(&id, &limits, 0) });
    }
    let live = reserve_class(&mut s, ("m", "live"), "l0", 100, &calendar);
    assert_eq!(live, 2_000, "after the backlog, not in its full windows");
    let bulk: Vec<Millis> =
        (0..5).map(|i| reserve_class(&mut s, ("m", "bulk"), &format!("b{i}"), 100, &calendar)).collect();
    // Window 2 holds the backlog's 5 and live's 1: bulk takes 3 (live's unused unit of its
    // reserve of 2 stays free), then goes to 3s.
    assert_eq!(bulk, [2_000, 2_000, 2_000, 3_000, 3_000]);
    let state = s.budget_state(&calendar.state_name(Some("m"))).unwrap();
    assert_eq!((state.carried, state.windows[&(SECOND, 2_000)]), (Some(2_000), 9));
    // Another key had no backlog: nothing carried, its classes start now.
    assert_eq!(reserve_class(&mut s, ("n", "bulk"), "n0", 100, &calendar), 100);
    assert_eq!(s.budget_state(&calendar.state_name(Some("n"))).unwrap().carried, Some(0));
}

#[test]
fn a_key_s_override_is_its_calendar_s_for_every_class_until_it_ends() {
    let calendar = live_reserve_calendar();
    let mut s = Scheduler::new();
    let id = override_id(&calendar.limits[0]);
    let raised = LimitOverride { limit: 20, until: Some(2_000) };
    assert_eq!(s.change_calendar_override(&calendar.state_name(Some("m")), &id, Some(raised)), None);
    let m: Vec<Millis> = (0..24)
        .map(|i| reserve_class(&mut s, ("m", ["bulk", "live"][i % 2]), &format!("m{i}"), 0, &calendar))
        .collect();
    // The count in force when they book is the override's: 20 in window 0, the other 4 in window 1.
    assert_eq!(m.iter().filter(|&&t| t == 0).count(), 20, "{m:?}");
    assert_eq!(m.iter().filter(|&&t| t == 1_000).count(), 4, "{m:?}");
    let n: Vec<Millis> =
        (0..11).map(|i| reserve_class(&mut s, ("n", "bulk"), &format!("n{i}"), 0, &calendar)).collect();
    assert_eq!(n.iter().filter(|&&t| t == 0).count(), 10, "another key keeps the rule's count");
    // A count below the cost refuses the event, for every class of the key.
    let lowered = LimitOverride { limit: 1, until: None };
    s.change_calendar_override(&calendar.state_name(Some("m")), &id, Some(lowered));
    let draws = [calendar.clone()];
    let request = ReserveRequest { cost: 2, budgets: &draws, class: Some(("m", "live")), ..request("big", &[], 0) };
    assert_eq!(s.reserve("payouts", "m#live", &request).status, Status::CostExceedsLimit);
    assert_eq!(s.change_calendar_override(&calendar.state_name(Some("m")), &id, None), Some(lowered));
}

#[test]
fn a_class_with_a_reserve_overtakes_a_bulk_backlog_of_its_key_and_keys_stay_apart() {
    let calendar = live_reserve_calendar();
    let mut s = Scheduler::new();
    let bulk: Vec<Millis> =
        (0..26).map(|i| reserve_class(&mut s, ("m", "bulk"), &format!("b{i}"), 0, &calendar)).collect();
    assert_eq!(bulk.iter().filter(|&&t| t == 0).count(), 10, "the current window's reserve is anyone's");
    assert_eq!(bulk.iter().filter(|&&t| t == 1_000).count(), 8);
    assert_eq!(bulk.iter().filter(|&&t| t == 2_000).count(), 8);
    assert!(bulk.windows(2).all(|w| w[0] <= w[1]), "FIFO within the class");
    // A live payout published behind the bulk backlog goes in the next window, not after it.
    let live: Vec<Millis> =
        (0..3).map(|i| reserve_class(&mut s, ("m", "live"), &format!("l{i}"), 100, &calendar)).collect();
    assert_eq!(live, [1_000, 1_000, 2_000]);
    // Another merchant's calendar is its own.
    assert_eq!(reserve_class(&mut s, ("n", "bulk"), "n0", 100, &calendar), 100);
    let m = s.budget_state("payouts|m").unwrap();
    assert_eq!((m.windows[&(SECOND, 1_000)], m.floor_used[&(SECOND, 1_000, "live".to_owned())]), (10, 2));
    assert_eq!(s.budget_state("payouts|n").unwrap().windows[&(SECOND, 0)], 1);
}

#[test]
fn an_adaptive_budget_counts_less_after_a_signal() {
    let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 100_000, step: 100_000, latency: None };
    let budget = Arc::new(Budget { adaptive: Some(adaptive), ..(*budget(10, Placement::Start, None)).clone() });
    let budgets = [budget.clone()];
    let mut s = Scheduler::new();
    s.signal_budget(&budget, 0);
    let slots: Vec<Millis> =
        (0..6).map(|i| reserve(&mut s, &format!("k{i}"), &format!("m{i}"), 100, &budgets).slot).collect();
    assert_eq!(slots, [100, 100, 100, 100, 100, 1_000], "5 of 10 in the window of the signal");
}

/// A fair budget's home shares a window max-min fair among the partitions that asked lately: a
/// partition that asks little gets all of it, one that holds a flood the rest, and the flood's
/// partition never takes what another live partition is still owed.
#[test]
fn a_fair_home_leases_max_min_fair_among_the_partitions_that_asked_lately() {
    assert_eq!(max_min_parts(20, vec![(0, 128), (1, 3), (2, 6)]), [(1, 3), (2, 6), (0, 11)]);
    assert_eq!(max_min_parts(10, vec![(0, 9), (1, 9)]), [(0, 5), (1, 5)], "equal parts of what is left");
    assert_eq!(max_min_parts(10, vec![]), []);
    let mut home = BudgetState::default();
    let grant = |home: &mut BudgetState, partition, want, (now, from)| {
        let lease = home.grant_fair((partition, 3, now), (SECOND, from, 3 * SECOND), 20, (1, want));
        (lease.window, lease.total)
    };
    assert_eq!(grant(&mut home, 0, 128, (0, 0)), (Some(0), 20), "alone: all of the window (work conserving)");
    assert_eq!(grant(&mut home, 1, 3, (10, 0)), (Some(SECOND), 3), "the window is leased out: the next");
    assert_eq!(grant(&mut home, 0, 128, (20, SECOND)), (Some(SECOND), 17), "the flood takes what p1 is not owed");
    assert_eq!(
        grant(&mut home, 0, 128, (25, 0)),
        (None, 0),
        "it holds a lease of the full window: its pool may have room"
    );
    assert_eq!(grant(&mut home, 2, 6, (30, 0)), (Some(2 * SECOND), 6), "p2 is owed its part of the next");
    assert_eq!(grant(&mut home, 0, 128, (40, 2 * SECOND)), (Some(2 * SECOND), 11), "p1's 3 stay owed");
    assert_eq!(home.windows.get(&(SECOND, 2 * SECOND)), Some(&17), "3 of 20 held for p1, who asked lately");
    // Two windows later p1's and p2's asks are stale: the flood's partition takes a whole window.
    assert_eq!(grant(&mut home, 0, 128, (2 * SECOND + 40, 3 * SECOND)), (Some(3 * SECOND), 20));
}

/// A classed key paused (its calendar's pause, every class's): each class parks in its own queue
/// and drains in its own order, booking with the ordinary arithmetic, so a class's reserve still
/// lets it overtake the other's backlog once the pause ends.
#[test]
fn a_paused_classed_key_parks_by_class_and_each_class_drains_keeping_its_reserve() {
    let calendar = live_reserve_calendar();
    let draws = [calendar.clone()];
    let class_request = |class: &'static str, id: &'static str, now| ReserveRequest {
        max_delay: 100 * SECOND,
        park: Some(2 * SECOND),
        budgets: &draws,
        class: Some(("m", class)),
        ..request(id, &[], now)
    };
    let bulk: Vec<&'static str> = (0..30).map(|i| &*format!("b{i}").leak()).collect();
    let live = ["l0", "l1", "l2"];
    let mut s = Scheduler::new();
    s.pause_budget(&calendar.state_name(Some("m")), 5_000);
    for id in &bulk {
        assert_eq!(s.reserve("payouts", "m#bulk", &class_request("bulk", id, 100)).status, Status::Parked);
    }
    for (i, id) in live.into_iter().enumerate() {
        let parked = s.reserve("payouts", "m#live", &class_request("live", id, 200));
        // The first one's slot is where the pause ends; the others wait behind it unsearched.
        let slot = if i == 0 { 5_000 } else { 200 };
        assert_eq!((parked.status, parked.slot), (Status::Parked, slot));
    }
    assert_eq!((s.parked("payouts", "m#bulk").len(), s.parked("payouts", "m#live").len()), (30, 3));
    assert_eq!(s.budget_state("payouts|m").map(|c| c.windows.len()), Some(0), "nothing booked while paused");
    // Another key of the rule is not paused: it books at once.
    let other = ReserveRequest { class: Some(("n", "bulk")), ..class_request("bulk", "n0", 300) };
    assert_eq!(s.reserve("payouts", "n#bulk", &other).status, Status::Reserved);
    // The pause ends at 5 s; bulk's drain runs first, up to a deadline of 7.5 s: all of window 5 s
    // (started: the reserve is anyone's), then 8 of 6 s and of 7 s (live's 2 held until each starts).
    let mut booked = Vec::new();
    for id in &bulk {
        match s.unpark("payouts", "m#bulk", &class_request("bulk", id, 5_000), 7_500) {
            Unpark::Decided(r) => booked.push(r.slot),
            Unpark::Later { slot, wake } => {
                assert_eq!((slot, wake), (8_000, 5_500));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(booked, [vec![5_000; 10], vec![6_000; 8], vec![7_000; 8]].concat());
    // Live's own drain overtakes bulk's backlog: its reserve of 6 s, then 7 s's.
    let live_slots: Vec<Millis> = live
        .iter()
        .map(|id| match s.unpark("payouts", "m#live", &class_request("live", id, 5_000), 7_500) {
            Unpark::Decided(r) => r.slot,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(live_slots, [6_000, 6_000, 7_000]);
    let m = s.budget_state("payouts|m").unwrap();
    assert_eq!([5_000, 6_000, 7_000].map(|w| m.windows[&(SECOND, w)]), [10, 10, 9], "no window over 10");
    assert_eq!((s.entity_state("payouts", "m#live").unwrap().parked, s.parked("payouts", "m#bulk").len()), (0, 4));
}
