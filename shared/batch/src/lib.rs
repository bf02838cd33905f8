//! Group commit, the one batching rule Drip uses for reservations (a `reserve.lua` call), delayed
//! events (a Cloud Task) and publishes (a Pub/Sub request): while a lane has `max_in_flight` calls
//! in flight, what arrives waits, and the next call carries everything waiting (as much as one
//! call takes). By default there is no timer: an item that arrives at an idle lane goes at once, so
//! batching never adds latency to a lone request, and batches grow exactly as fast as calls are
//! slower than arrivals. A lane may be given a [`Linger`]: each call it makes then waits up to that
//! long for others to join (delayed events, whose slot is seconds away, can afford it; their push
//! is answered later, the event is not delivered later), and no longer than anyone can still join:
//! told who its callers are, a lane goes as soon as every caller in flight is already waiting.
//!
//! A batch's call runs in a task of its own, so a caller that gives up (a deadline, a dropped
//! request) never strands the answers of the others waiting with it; an item that finds its lane
//! idle (no call in flight) is carried by its caller's own task (no spawn, no channel: a lone push pays nothing for
//! batching), and should that caller give up, the lane passes to what waits.
//!
//! An item whose caller gives up while it still waits is withdrawn: no call ever carries it, so a
//! caller that reports failure never leaves its item to be sent anyway. Once a call carries an item
//! it is not withdrawn (a call cannot take back what it sent): a caller must wait for the outcome
//! of a call in flight, which is why a flusher bounds its own calls (the Pub/Sub client's retry
//! time limit, Cloud Tasks' attempt timeout) rather than its callers bounding theirs tighter.
//!
//! The rules every batching service follows are written here once: [`Batcher`] makes a batching
//! of one item a call inline in its caller's task (Pub/Sub publishes, Cloud Tasks creates), and
//! [`fan_out`] makes one failed call every one of its items' failure.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// What one call does with a batch.
pub trait Flush: Send + Sync + 'static {
    /// Items of different lanes never share a call.
    type Lane: Hash + Eq + Clone + Send + Sync + 'static;
    type Item: Send + 'static;
    type Output: Send + 'static;

    /// How many of the waiting items (at least one) the next call takes.
    fn take(&self, waiting: &mut dyn Iterator<Item = &Self::Item>) -> usize;

    /// Carries `items` in one call; one output per item, in order.
    fn flush(&self, lane: &Self::Lane, items: Vec<Self::Item>) -> impl Future<Output = Vec<Self::Output>> + Send;

    /// The most calls `lane` has in flight at once, where it differs from the group's.
    fn in_flight_of(&self, _lane: &Self::Lane) -> Option<usize> {
        None
    }
}

/// The count limit most flushers use in [`Flush::take`].
pub fn up_to<T>(max: usize, waiting: &mut dyn Iterator<Item = &T>) -> usize {
    waiting.take(max.max(1)).count()
}

struct Waiting<F: Flush> {
    /// Which submission it is, to withdraw it if its caller gives up.
    id: u64,
    item: F::Item,
    reply: oneshot::Sender<F::Output>,
}

/// Withdraws a waiting item when its caller gives up (the submit future is dropped) before a call
/// took it.
struct Withdraw<'a, F: Flush> {
    group: &'a GroupCommit<F>,
    lane: &'a F::Lane,
    id: u64,
    armed: bool,
}

impl<F: Flush> Drop for Withdraw<'_, F> {
    fn drop(&mut self) {
        if self.armed
            && let Some(entry) = self.group.lanes().get_mut(self.lane)
        {
            entry.waiting.retain(|w| w.id != self.id);
        }
    }
}

/// How a submitted item goes.
enum Start<T> {
    /// In a call of its own, made by the caller.
    Alone(T),
    /// Queued, and the caller starts a call for the lane's queue.
    Driver,
    /// Queued for a call in flight to take.
    Waits,
}

/// Hands a lane's slot in flight on when a call made in a caller's task ends (or is dropped).
struct HandOn<F: Flush> {
    group: Arc<GroupCommit<F>>,
    lane: Option<F::Lane>,
}

impl<F: Flush> Drop for HandOn<F> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            Arc::clone(&self.group).hand_on(lane);
        }
    }
}

/// The callers in flight that may still submit items (a service's requests being handled): a
/// linger that knows them stops waiting once each one is already waiting or being carried.
#[derive(Debug, Default)]
pub struct Callers(AtomicUsize);

impl Callers {
    /// Counts a caller in until the returned guard is dropped.
    pub fn enter(self: &Arc<Self>) -> Caller {
        self.0.fetch_add(1, Ordering::Relaxed);
        Caller(Arc::clone(self))
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A caller counted in [`Callers`] while it lives.
#[derive(Debug)]
pub struct Caller(Arc<Callers>);

impl Drop for Caller {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long each call of a lane waits for others to join it.
#[derive(Debug, Clone, Default)]
pub struct Linger {
    /// The longest wait (zero: none; an item at an idle lane then goes at once).
    pub length: Duration,
    /// Who may still submit: once as many items are waiting or being carried as there are callers
    /// in flight, nothing more can join, and the call goes. `None`: always the whole length.
    pub callers: Option<Arc<Callers>>,
}

impl Linger {
    pub fn fixed(length: Duration) -> Self {
        Self { length, callers: None }
    }
}

struct Lane<F: Flush> {
    in_flight: usize,
    waiting: VecDeque<Waiting<F>>,
}

/// Groups the items submitted to each lane into calls of `F`.
pub struct GroupCommit<F: Flush> {
    flusher: F,
    max_in_flight: usize,
    /// How long each call of a lane waits for others to join before it takes its batch.
    linger: Linger,
    /// Items submitted and not yet answered, waiting or in a call, over every lane: counted only
    /// where the linger knows its callers (nothing else reads it).
    held: Arc<Callers>,
    lanes: Mutex<HashMap<F::Lane, Lane<F>>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl<F: Flush> std::fmt::Debug for GroupCommit<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("max_in_flight", &self.max_in_flight).finish_non_exhaustive()
    }
}

impl<F: Flush> GroupCommit<F> {
    pub fn new(flusher: F, max_in_flight: usize) -> Arc<Self> {
        Self::with_linger(flusher, max_in_flight, Linger::default())
    }

    /// The same, where each call waits as `linger` says for others to join it.
    pub fn with_linger(flusher: F, max_in_flight: usize, linger: Linger) -> Arc<Self> {
        Arc::new(Self {
            flusher,
            max_in_flight: max_in_flight.max(1),
            linger,
            held: Arc::default(),
            lanes: Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn flusher(&self) -> &F {
        &self.flusher
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<F::Lane, Lane<F>>> {
        // Every change under the lock is one step: a panic elsewhere cannot leave a lane half-changed.
        self.lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `item`'s output, once the call that carries it is done; `None` only when that call never
    /// answered (the runtime is shutting down, or the flusher panicked). Dropped before a call took
    /// the item, it withdraws it.
    pub async fn submit(self: &Arc<Self>, lane: F::Lane, item: F::Item) -> Option<F::Output> {
        let (reply, answer) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _held = self.linger.callers.is_some().then(|| self.held.enter());
        let start = {
            let mut lanes = self.lanes();
            let entry = lanes.entry(lane.clone()).or_insert_with(|| Lane { in_flight: 0, waiting: VecDeque::new() });
            let idle = entry.in_flight == 0;
            let free = entry.in_flight < self.flusher.in_flight_of(&lane).map_or(self.max_in_flight, |n| n.max(1));
            if free {
                entry.in_flight += 1;
            }
            // Only on an idle lane: with calls in flight, a spawned call leaves what arrives with
            // it a moment to join (batches under load stay as large as before).
            if idle && entry.waiting.is_empty() && self.linger.length.is_zero() {
                Start::Alone(item)
            } else {
                entry.waiting.push_back(Waiting { id, item, reply });
                if free { Start::Driver } else { Start::Waits }
            }
        };
        match start {
            // The lane is idle: the call carries this item alone, in the caller's own task (no
            // spawn, no channel). What arrives meanwhile waits for it or for another call in
            // flight; should the caller give up, the guard hands the lane on.
            Start::Alone(item) => {
                let _hand_on = HandOn { group: Arc::clone(self), lane: Some(lane.clone()) };
                self.flusher.flush(&lane, vec![item]).await.into_iter().next()
            }
            Start::Driver => {
                tokio::spawn(Arc::clone(self).drive(lane.clone()));
                self.await_answer(&lane, id, answer).await
            }
            Start::Waits => self.await_answer(&lane, id, answer).await,
        }
    }

    /// The answer to a queued item; dropped before it comes, the item is withdrawn if no call took
    /// it yet.
    async fn await_answer(&self, lane: &F::Lane, id: u64, answer: oneshot::Receiver<F::Output>) -> Option<F::Output> {
        let mut withdraw = Withdraw { group: self, lane, id, armed: true };
        let output = answer.await.ok();
        withdraw.armed = false;
        output
    }

    fn next_batch(&self, lane: &F::Lane) -> Option<Vec<Waiting<F>>> {
        let mut lanes = self.lanes();
        let entry = lanes.get_mut(lane)?;
        if entry.waiting.is_empty() {
            entry.in_flight -= 1;
            if entry.in_flight == 0 {
                lanes.remove(lane);
            }
            return None;
        }
        let take = self.flusher.take(&mut entry.waiting.iter().map(|w| &w.item)).clamp(1, entry.waiting.len());
        Some(entry.waiting.drain(..take).collect())
    }

    /// The end of a call made in a caller's task: its slot in flight drives what waits, if
    /// anything does (and a runtime is left to run it), or is freed.
    fn hand_on(self: Arc<Self>, lane: F::Lane) {
        let runtime = tokio::runtime::Handle::try_current().ok();
        {
            let mut lanes = self.lanes();
            let Some(entry) = lanes.get_mut(&lane) else { return };
            if entry.waiting.is_empty() || runtime.is_none() {
                entry.in_flight -= 1;
                if entry.in_flight == 0 && entry.waiting.is_empty() {
                    lanes.remove(&lane);
                }
                return;
            }
        }
        if let Some(runtime) = runtime {
            drop(runtime.spawn(self.drive(lane)));
        }
    }

    /// Waits the linger's length, or less once every caller in flight is held here.
    async fn linger(&self) {
        let Some(callers) = &self.linger.callers else {
            return tokio::time::sleep(self.linger.length).await;
        };
        let deadline = tokio::time::Instant::now() + self.linger.length;
        // Looked at every twentieth of the linger: a caller's arrival or departure wakes nothing.
        let step = (self.linger.length / 20).max(Duration::from_millis(1));
        while self.held.count() < callers.count() {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return;
            }
            tokio::time::sleep(step.min(deadline - now)).await;
        }
    }

    async fn drive(self: Arc<Self>, lane: F::Lane) {
        loop {
            // A lingering lane waits before each of its calls, not only the first: under a steady
            // load the callers a call answered come back within the linger and share the next.
            if !self.linger.length.is_zero() {
                self.linger().await;
            }
            let Some(batch) = self.next_batch(&lane) else { break };
            let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.item, w.reply)).unzip();
            let outputs = self.flusher.flush(&lane, items).await;
            for (reply, output) in replies.into_iter().zip(outputs) {
                let _ = reply.send(output);
            }
        }
    }
}

/// Group commit where batching is on, else every item in a call of its own made in its caller's
/// task: the one place where "at most one item a call" means "call inline" (no lanes, no spawn).
pub enum Batcher<F: Flush> {
    Inline(F),
    Grouped(Arc<GroupCommit<F>>),
}

impl<F: Flush> std::fmt::Debug for Batcher<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Batcher::Inline"),
            Self::Grouped(group) => f.debug_tuple("Batcher::Grouped").field(group).finish(),
        }
    }
}

impl<F: Flush> Batcher<F> {
    /// `max_items`: the most items one call carries (1 or less: each inline); what else as
    /// [`GroupCommit::with_linger`].
    pub fn new(flusher: F, max_items: usize, max_in_flight: usize, linger: Linger) -> Self {
        if max_items <= 1 {
            Self::Inline(flusher)
        } else {
            Self::Grouped(GroupCommit::with_linger(flusher, max_in_flight, linger))
        }
    }

    pub fn flusher(&self) -> &F {
        match self {
            Self::Inline(flusher) => flusher,
            Self::Grouped(group) => group.flusher(),
        }
    }

    /// As [`GroupCommit::submit`]; inline, the caller's own call.
    pub async fn submit(&self, lane: F::Lane, item: F::Item) -> Option<F::Output> {
        match self {
            Self::Inline(flusher) => flusher.flush(&lane, vec![item]).await.into_iter().next(),
            Self::Grouped(group) => group.submit(lane, item).await,
        }
    }
}

/// A call's outcome as each of its `count` items sees it: its answers, one each, or its failure,
/// shared by every item (one failure fans out).
pub fn fan_out<T, E: Clone>(count: usize, call: Result<Vec<T>, E>) -> Vec<Result<T, E>> {
    match call {
        Ok(answers) => answers.into_iter().map(Ok).collect(),
        Err(error) => (0..count).map(|_| Err(error.clone())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Doubles each item, after a pause, recording the batches it was given.
    struct Doubler {
        batches: Mutex<Vec<Vec<u32>>>,
        /// The task each call ran in.
        tasks: Mutex<Vec<Option<tokio::task::Id>>>,
        calls: AtomicUsize,
        max: usize,
        /// A lane allowed one call in flight, whatever the group's limit.
        narrow: Option<&'static str>,
        /// By lane: its calls in flight now, and the most at once.
        in_flight: Mutex<HashMap<&'static str, (usize, usize)>>,
    }

    impl Flush for Doubler {
        type Lane = &'static str;
        type Item = u32;
        type Output = u32;

        fn take(&self, waiting: &mut dyn Iterator<Item = &u32>) -> usize {
            up_to(self.max, waiting)
        }

        async fn flush(&self, lane: &&'static str, items: Vec<u32>) -> Vec<u32> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.batches.lock().unwrap().push(items.clone());
            self.tasks.lock().unwrap().push(tokio::task::try_id());
            {
                let mut in_flight = self.in_flight.lock().unwrap();
                let (now, most) = in_flight.entry(*lane).or_default();
                *now += 1;
                *most = (*most).max(*now);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.in_flight.lock().unwrap().get_mut(lane).expect("counted").0 -= 1;
            items.into_iter().map(|i| i * 2).collect()
        }

        fn in_flight_of(&self, lane: &&'static str) -> Option<usize> {
            (self.narrow == Some(*lane)).then_some(1)
        }
    }

    fn doubler(max: usize, in_flight: usize) -> Arc<GroupCommit<Doubler>> {
        doubler_narrowing(max, in_flight, None)
    }

    fn doubler_narrowing(max: usize, in_flight: usize, narrow: Option<&'static str>) -> Arc<GroupCommit<Doubler>> {
        GroupCommit::new(Doubler { narrow, ..Doubler::new(max) }, in_flight)
    }

    impl Doubler {
        fn new(max: usize) -> Self {
            let (batches, tasks, in_flight) = (Mutex::default(), Mutex::default(), Mutex::default());
            Doubler { batches, tasks, calls: AtomicUsize::new(0), max, narrow: None, in_flight }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_item_goes_at_once_and_alone() {
        let group = doubler(64, 1);
        let started = tokio::time::Instant::now();
        assert_eq!(group.submit("a", 21).await, Some(42));
        assert_eq!(started.elapsed(), Duration::from_millis(10), "no wait before its call");
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![21]]);
    }

    /// A lane of one call in flight with a linger of `ms`.
    fn lingering(ms: u64) -> Arc<GroupCommit<Doubler>> {
        lingering_as(Linger::fixed(Duration::from_millis(ms)))
    }

    /// A lane of one call in flight with a linger of `ms` that knows its callers.
    fn lingering_for(ms: u64, callers: &Arc<Callers>) -> Arc<GroupCommit<Doubler>> {
        lingering_as(Linger { length: Duration::from_millis(ms), callers: Some(Arc::clone(callers)) })
    }

    fn lingering_as(linger: Linger) -> Arc<GroupCommit<Doubler>> {
        let flusher = Doubler::new(64);
        GroupCommit::with_linger(flusher, 1, linger)
    }

    /// Told its callers, a linger ends as soon as every caller in flight waits in it: no one else
    /// can join, and waiting on would only slow them all.
    #[tokio::test(start_paused = true)]
    async fn a_linger_that_knows_its_callers_goes_once_every_caller_waits() {
        let callers = Arc::new(Callers::default());
        let group = lingering_for(50, &callers);
        let started = tokio::time::Instant::now();
        let submit = |item, after| {
            let caller = callers.enter();
            let group = &group;
            async move {
                let output = submit_after(group, item, after).await;
                drop(caller);
                output
            }
        };
        let (a, b, c) = tokio::join!(submit(1, 0), submit(2, 5), submit(3, 10));
        assert_eq!((a, b, c), (Some(2), Some(4), Some(6)));
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1, 2, 3]], "one call for the three");
        let took = started.elapsed();
        assert!(
            took <= Duration::from_millis(10 + 3 + 10),
            "the call went once the third waited, not after 50 ms: {took:?}"
        );
        assert_eq!(callers.count(), 0);
    }

    /// A caller still in flight that has not submitted yet may: the linger waits for it, up to its
    /// length, and a lone caller at an idle lane goes at once.
    #[tokio::test(start_paused = true)]
    async fn a_linger_that_knows_its_callers_waits_while_one_may_still_join() {
        let callers = Arc::new(Callers::default());
        let group = lingering_for(50, &callers);
        let busy_elsewhere = callers.enter();
        let started = tokio::time::Instant::now();
        let caller = callers.enter();
        assert_eq!(group.submit("a", 1).await, Some(2));
        assert_eq!(started.elapsed(), Duration::from_millis(60), "the whole linger, then the call");
        drop(busy_elsewhere);
        let started = tokio::time::Instant::now();
        assert_eq!(group.submit("a", 2).await, Some(4));
        // The lane's driver was still lingering after the first call (for callers coming back):
        // it sees at its next look (every 2.5 ms) that no one else can join.
        let took = started.elapsed();
        assert!(took <= Duration::from_millis(10 + 3), "alone in flight: no linger before its call, took {took:?}");
        drop(caller);
    }

    /// Submits `item` to lane "a" `after` ms from now.
    async fn submit_after(group: &Arc<GroupCommit<Doubler>>, item: u32, after: u64) -> Option<u32> {
        tokio::time::sleep(Duration::from_millis(after)).await;
        group.submit("a", item).await
    }

    /// With a linger, the first item at an idle lane waits that long, and what arrives meanwhile
    /// shares its call.
    #[tokio::test(start_paused = true)]
    async fn with_a_linger_items_arriving_close_together_share_a_call() {
        let group = lingering(50);
        let started = tokio::time::Instant::now();
        let submit = |item, after| submit_after(&group, item, after);
        let (a, b, c) = tokio::join!(submit(1, 0), submit(2, 20), submit(3, 40));
        assert_eq!((a, b, c), (Some(2), Some(4), Some(6)));
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1, 2, 3]], "one call for the three");
        assert_eq!(started.elapsed(), Duration::from_millis(60), "the linger, then the call");
    }

    /// A lingering lane waits before every call, not only its first: an item that arrives just
    /// after a call ended (a caller that call answered, coming back) shares the next call with what
    /// arrived while it was in flight, rather than that call leaving at once without it.
    #[tokio::test(start_paused = true)]
    async fn a_lingering_lane_waits_before_each_call_so_callers_coming_back_share_the_next() {
        let group = lingering(50);
        let submit = |item, after| submit_after(&group, item, after);
        // The first call runs from 50 to 60 ms; 2 arrives while it is in flight, 3 after it ended.
        let (a, b, c) = tokio::join!(submit(1, 0), submit(2, 55), submit(3, 70));
        assert_eq!((a, b, c), (Some(2), Some(4), Some(6)));
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1], vec![2, 3]], "2 waited for 3");
    }

    /// A lone item's call runs in its caller's task (no spawn, no channel on the path of a lone
    /// push); a batch's in a task of its own, which no caller's giving up can cancel.
    #[tokio::test(start_paused = true)]
    async fn a_lone_item_is_carried_by_its_caller_and_a_batch_by_a_task_of_its_own() {
        let group = doubler(64, 1);
        let caller = tokio::spawn({
            let group = group.clone();
            async move { (group.submit("a", 1).await, tokio::task::id()) }
        });
        tokio::task::yield_now().await;
        let (second, third) = (group.clone(), group.clone());
        let waiting = tokio::spawn(async move { second.submit("a", 2).await });
        let also = tokio::spawn(async move { third.submit("a", 3).await });
        let (alone, caller_task) = caller.await.unwrap();
        assert_eq!((alone, waiting.await.unwrap(), also.await.unwrap()), (Some(2), Some(4), Some(6)));
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1], vec![2, 3]]);
        let tasks = group.flusher().tasks.lock().unwrap().clone();
        assert_eq!(tasks[0], Some(caller_task), "the lone item's call ran in its caller's task");
        assert!(tasks[1].is_some() && tasks[1] != Some(caller_task), "the batch ran in a task of its own");
    }

    #[tokio::test(start_paused = true)]
    async fn what_arrives_during_a_call_goes_together_in_the_next_each_with_its_own_output() {
        let group = doubler(3, 1);
        let outputs = futures(&group, "a", 0..7).await;
        assert_eq!(outputs, (0..7).map(|i| Some(i * 2)).collect::<Vec<_>>());
        // The first arrives alone; the six that waited for it go three a call, in order.
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![0], vec![1, 2, 3], vec![4, 5, 6]]);
    }

    #[tokio::test(start_paused = true)]
    async fn lanes_never_share_a_call_and_run_concurrently() {
        let group = doubler(64, 1);
        let (a, b) = tokio::join!(futures(&group, "a", 0..3), futures(&group, "b", 10..13));
        assert_eq!((a.len(), b.len()), (3, 3));
        let batches = group.flusher().batches.lock().unwrap().clone();
        assert!(batches.iter().all(|b| b.iter().all(|&i| i < 10) || b.iter().all(|&i| i >= 10)), "{batches:?}");
    }

    /// A lane its flusher narrows (`in_flight_of`) has no more calls in flight at once than that,
    /// while the group's other lanes have the group's limit.
    #[tokio::test(start_paused = true)]
    async fn a_lane_the_flusher_narrows_has_fewer_calls_in_flight() {
        let group = doubler_narrowing(1, 4, Some("narrow"));
        let (narrow, wide) = tokio::join!(futures(&group, "narrow", 0..8), futures(&group, "wide", 10..18));
        assert_eq!(narrow, (0..8).map(|i| Some(i * 2)).collect::<Vec<_>>());
        assert_eq!(wide.len(), 8);
        let most = |lane| group.flusher().in_flight.lock().unwrap()[lane].1;
        assert_eq!((most("narrow"), most("wide")), (1, 4));
    }

    /// A caller that gives up while its item waits for a call in flight withdraws it: no call
    /// carries it (its caller reported failure; it must not be sent anyway), and what comes after
    /// it is not held up.
    #[tokio::test(start_paused = true)]
    async fn an_item_whose_caller_gave_up_while_it_waited_is_never_sent() {
        let group = doubler(64, 1);
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit("a", 1).await }
        });
        tokio::task::yield_now().await;
        let gave_up = tokio::time::timeout(Duration::from_millis(5), group.submit("a", 2)).await;
        assert!(gave_up.is_err(), "it waited for the call in flight, and gave up");
        let (later, first) = tokio::join!(group.submit("a", 3), first);
        assert_eq!((first.unwrap(), later), (Some(2), Some(6)));
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1], vec![3]], "2 was never sent");
    }

    /// Once a call carries an item, a caller that gives up does not take it back: the call's
    /// outcome stands (it is sent), so callers wait for a call in flight.
    #[tokio::test(start_paused = true)]
    async fn an_item_a_call_carries_is_sent_whoever_gives_up() {
        let group = doubler(64, 1);
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit("a", 1).await }
        });
        tokio::task::yield_now().await;
        // 2 waits for 1's call (10 ms), then a call carries it (10 ms more); its caller gives up
        // during that call.
        let gave_up = tokio::time::timeout(Duration::from_millis(15), group.submit("a", 2)).await;
        assert!(gave_up.is_err());
        first.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*group.flusher().batches.lock().unwrap(), [vec![1], vec![2]], "2's call went on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_strands_no_one() {
        let group = doubler(64, 1);
        let gives_up = tokio::time::timeout(Duration::from_millis(1), group.submit("a", 1));
        let (gave_up, waited) = tokio::join!(gives_up, group.submit("a", 2));
        assert!(gave_up.is_err());
        assert_eq!(waited, Some(4));
    }

    async fn futures(
        group: &Arc<GroupCommit<Doubler>>,
        lane: &'static str,
        items: std::ops::Range<u32>,
    ) -> Vec<Option<u32>> {
        let mut handles = Vec::new();
        for i in items {
            let group = group.clone();
            handles.push(tokio::spawn(async move { group.submit(lane, i).await }));
            tokio::task::yield_now().await;
        }
        let mut outputs = Vec::new();
        for handle in handles {
            outputs.push(handle.await.unwrap());
        }
        outputs
    }

    /// Three items at once: a batcher of one gives each a call of its own, in its caller's task;
    /// a batcher of more groups those that arrive while a call is in flight.
    #[tokio::test(start_paused = true)]
    async fn a_batcher_of_one_calls_inline_and_a_larger_one_groups() {
        let batchers = [1, 64].map(|max| Batcher::new(Doubler::new(max), max, 1, Linger::default()));
        assert!(matches!(batchers[0], Batcher::Inline(_)) && matches!(batchers[1], Batcher::Grouped(_)));
        for batcher in &batchers {
            let answers = tokio::join!(batcher.submit("a", 1), batcher.submit("a", 2), batcher.submit("a", 3));
            assert_eq!(answers, (Some(2), Some(4), Some(6)));
        }
        assert_eq!(*batchers[0].flusher().batches.lock().unwrap(), [vec![1], vec![2], vec![3]]);
        assert_eq!(*batchers[1].flusher().batches.lock().unwrap(), [vec![1], vec![2, 3]]);
        let inline = batchers[0].flusher().tasks.lock().unwrap().clone();
        assert!(inline.iter().all(|task| *task == inline[0]), "all in the caller's task: {inline:?}");
    }

    #[test]
    fn one_failure_fans_out_to_every_item() {
        assert_eq!(fan_out::<u32, &str>(3, Err("down")), [Err("down"), Err("down"), Err("down")]);
        assert_eq!(fan_out::<u32, &str>(2, Ok(vec![7, 8])), [Ok(7), Ok(8)]);
    }
}
