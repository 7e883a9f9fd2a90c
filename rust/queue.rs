//! A thread-safe priority queue with six FIFO lanes, one per priority.
//!
//! Priority 0 is served first, and items of one priority come out in the order
//! they went in. A bitmask of the non-empty lanes finds the lane to serve with
//! one `trailing_zeros`, so push and pop are O(1): there is no heap.
//!
//! # Capacity and overflow
//!
//! A bounded queue applies an [`Overflow`] policy when it holds `capacity`
//! items. [`Overflow::Reject`] refuses the push ([`PushError::Full`], the item
//! comes back). [`Overflow::Shed`] drops one item and hands it back to the
//! caller, so nothing is lost silently: the victim is the newest item of the
//! lowest-priority non-empty lane, unless the incoming item's priority is
//! numerically greater than or equal to that lane's, in which case the incoming
//! item itself is the victim (it would be the newest of the lowest priority).
//!
//! # Aging
//!
//! With a starvation limit `k`, each lane counts how many pops passed it over.
//! On every pop (and for every item of a multi-item pop):
//!
//! 1. if some non-empty lane has a counter `>= k`, the lowest-numbered such lane
//!    is served; otherwise the lowest-numbered non-empty lane is served;
//! 2. the served lane `c` gets its counter set to 0, and every *other*
//!    non-empty lane `l` with `l > c` gets its counter increased by 1 (lanes
//!    numbered below `c` are left alone);
//! 3. a lane that becomes empty, by a pop or by shedding, has its counter reset
//!    to 0, so an empty lane always has a counter of 0.
//!
//! Pushes never change the counters. Without a starvation limit the counters
//! are not kept and the queue is strictly by priority.
//!
//! # Closing
//!
//! After [`PriorityQueue::close`], every push fails with [`PushError::Closed`];
//! pops drain what is left and then return at once with nothing, waking any
//! blocked consumer.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

mod lanes;

use lanes::{Admit, State};

/// The number of priorities (lanes): 0 (highest) to 5 (lowest).
pub const LANES: usize = 6;

/// What a bounded queue does with a push when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Refuse the push with [`PushError::Full`].
    Reject,
    /// Drop the newest lowest-priority item (possibly the incoming one) and return it.
    Shed,
}

/// A refused push; the refused item(s) come back to the caller.
pub enum PushError<T> {
    /// The queue is full under [`Overflow::Reject`].
    Full(T),
    /// The queue was closed.
    Closed(T),
}

impl<T> PushError<T> {
    /// The refused item(s).
    pub fn into_inner(self) -> T {
        match self {
            PushError::Full(item) | PushError::Closed(item) => item,
        }
    }

    /// The same refusal over other item(s).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> PushError<U> {
        match self {
            PushError::Full(item) => PushError::Full(f(item)),
            PushError::Closed(item) => PushError::Closed(f(item)),
        }
    }

    /// Whether the push was refused because the queue is closed.
    pub fn is_closed(&self) -> bool {
        matches!(self, PushError::Closed(_))
    }
}

impl<T> fmt::Debug for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PushError::Full(_) => "Full(..)",
            PushError::Closed(_) => "Closed(..)",
        })
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PushError::Full(_) => "the queue is full",
            PushError::Closed(_) => "the queue is closed",
        })
    }
}

/// A thread-safe priority queue: six FIFO lanes and a bitmask of the non-empty ones.
///
/// The overflow, aging and closing rules are those of the module documentation
/// (`rust/queue.rs`).
/// Items are only moved while the lock is held: no caller code runs under it.
pub struct PriorityQueue<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    capacity: Option<usize>,
    overflow: Overflow,
    starvation_limit: Option<u32>,
}

impl<T> fmt::Debug for PriorityQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityQueue")
            .field("capacity", &self.capacity)
            .field("overflow", &self.overflow)
            .field("starvation_limit", &self.starvation_limit)
            .field("depths", &self.depths())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

#[inline]
fn check_priority(priority: u8) {
    assert!(
        usize::from(priority) < LANES,
        "priority {priority} is out of range 0..{}",
        LANES - 1
    );
}

/// How many of `priorities` fall in each lane.
///
/// # Panics
///
/// If a priority is above 5.
#[inline]
fn lane_counts(priorities: impl Iterator<Item = u8>) -> [usize; LANES] {
    // Counted in one register, ten bits a lane, emptied every 1023 items: an
    // array indexed by lane would make each increment wait for the last one
    // through memory.
    const CHUNK: usize = (1 << 10) - 1;
    let mut out = [0usize; LANES];
    let mut packed = 0u64;
    let mut in_chunk = 0;
    let mut unpack = |packed: u64| {
        for (lane, n) in out.iter_mut().enumerate() {
            *n += ((packed >> (10 * lane)) & 0x3ff) as usize;
        }
    };
    for priority in priorities {
        check_priority(priority);
        packed += 1 << (10 * u32::from(priority));
        in_chunk += 1;
        if in_chunk == CHUNK {
            unpack(packed);
            packed = 0;
            in_chunk = 0;
        }
    }
    unpack(packed);
    out
}

impl<T> PriorityQueue<T> {
    /// A queue holding at most `capacity` items (`None`: no bound).
    ///
    /// `starvation_limit` turns aging on: a non-empty lane passed over by that
    /// many pops is served next. A limit of 0 makes every lane "aged", which is
    /// the same as strict priority.
    #[must_use]
    pub fn new(capacity: Option<usize>, overflow: Overflow, starvation_limit: Option<u32>) -> Self {
        PriorityQueue {
            state: Mutex::new(State::new()),
            not_empty: Condvar::new(),
            capacity,
            overflow,
            starvation_limit,
        }
    }

    /// Queue `item` at `priority` (0..=5).
    ///
    /// Returns `Ok(Some(dropped))` when the shed policy dropped an item to make
    /// room (possibly `item` itself), `Ok(None)` otherwise.
    ///
    /// # Panics
    ///
    /// If `priority > 5`.
    pub fn push(&self, item: T, priority: u8) -> Result<Option<T>, PushError<T>> {
        check_priority(priority);
        let mut state = self.state.lock();
        let admitted = state.admit(item, priority, self.capacity, self.overflow);
        drop(state);
        match admitted {
            Admit::Queued => {
                self.not_empty.notify_one();
                Ok(None)
            }
            Admit::Shed(victim) => {
                // The incoming item may have replaced a queued one: a waiter may need it.
                self.not_empty.notify_one();
                Ok(Some(victim))
            }
            Admit::Refused(err) => Err(err),
        }
    }

    /// Queue `item` at `priority` (0..=5) if `admit` agrees, all under the queue's lock.
    ///
    /// A closed queue, then a full one (under either overflow policy: nothing
    /// is shed), refuses before `admit` runs, so `admit` may record something
    /// (an id in a de-duplication window) only for an item that is then
    /// queued. `Ok(false)` when `admit` says no; the item is dropped after the
    /// lock is released. `admit` runs with the lock held: it must not touch
    /// this queue.
    ///
    /// # Panics
    ///
    /// If `priority > 5`.
    pub fn push_checked(
        &self,
        item: T,
        priority: u8,
        admit: impl FnOnce() -> bool,
    ) -> Result<bool, PushError<T>> {
        check_priority(priority);
        let mut state = self.state.lock();
        if state.closed {
            return Err(PushError::Closed(item));
        }
        if self.capacity.is_some_and(|capacity| state.len >= capacity) {
            return Err(PushError::Full(item));
        }
        if !admit() {
            drop(state);
            drop(item);
            return Ok(false);
        }
        state.enqueue(item, priority);
        drop(state);
        self.not_empty.notify_one();
        Ok(true)
    }

    /// Queue several items under one lock.
    ///
    /// Under [`Overflow::Reject`] it is all or nothing: when not every item
    /// fits, nothing is queued and every item comes back in
    /// [`PushError::Full`]. Under [`Overflow::Shed`] the items are admitted in
    /// order and the dropped ones are returned, in the order they were dropped.
    /// A closed queue refuses the batch, even an empty one.
    ///
    /// # Panics
    ///
    /// If a priority is above 5 (before anything is queued).
    pub fn push_many(&self, items: Vec<(T, u8)>) -> Result<Vec<T>, PushError<Vec<(T, u8)>>> {
        let per_lane = lane_counts(items.iter().map(|&(_, priority)| priority));
        let mut state = self.state.lock();
        if let Err(err) = self.check_batch(&state, items.len()) {
            return Err(err.map(|()| items));
        }
        let count = items.len();
        let dropped = self.queue_batch(&mut state, per_lane, count, items.into_iter());
        drop(state);
        self.notify(count);
        Ok(dropped)
    }

    /// [`push_many`](Self::push_many) for items whose lanes are known apart:
    /// item `i` of `items` goes to lane `lanes[i]`.
    ///
    /// `items` runs under the queue's lock, so it must only hand over items
    /// made beforehand (it must not touch this queue); nothing goes through an
    /// intermediate vector. It is read for at most `lanes.len()` items; if it
    /// ends early, the items it gave are queued. A refused batch leaves
    /// `items` unread.
    ///
    /// # Panics
    ///
    /// If a lane is above 5 (before anything is queued).
    pub fn push_many_in_lanes(
        &self,
        lanes: &[u8],
        items: impl IntoIterator<Item = T>,
    ) -> Result<Vec<T>, PushError<()>> {
        let per_lane = lane_counts(lanes.iter().copied());
        let mut state = self.state.lock();
        self.check_batch(&state, lanes.len())?;
        let mut count = 0usize;
        let items = items.into_iter().zip(lanes.iter().copied()).inspect(|_| {
            count += 1;
        });
        let dropped = self.queue_batch(&mut state, per_lane, lanes.len(), items);
        drop(state);
        self.notify(count);
        Ok(dropped)
    }

    /// Queue a batch that fits, made item by item under the lock: all or nothing.
    ///
    /// When the queue is open and has room for `count` more items (under
    /// either policy: nothing is shed), the first `count` items of `items`
    /// are queued and `Ok(true)` returned; otherwise `Ok(false)` and `items`
    /// is left unread, for the caller to take [`push_many`](Self::push_many)
    /// or [`push_many_in_lanes`](Self::push_many_in_lanes). An item that is
    /// an `Err` stops the batch: the items queued before it are taken out
    /// again and the error is returned. `items` runs under the queue's lock,
    /// so it must only check and hand over items (it must not touch this
    /// queue); the items taken out are dropped after the lock is released.
    ///
    /// # Panics
    ///
    /// If a priority is above 5 (after the batch is taken out again).
    pub fn push_many_fitting<E>(
        &self,
        count: usize,
        items: impl IntoIterator<Item = Result<(T, u8), E>>,
    ) -> Result<bool, E> {
        let mut state = self.state.lock();
        if state.closed
            || self
                .capacity
                .is_some_and(|cap| count > cap.saturating_sub(state.len))
        {
            return Ok(false);
        }
        let st = &mut *state;
        let before: [usize; LANES] = std::array::from_fn(|p| st.lanes[p].len());
        let mut stop = None;
        for (i, item) in items.into_iter().take(count).enumerate() {
            match item {
                Ok((item, priority)) if usize::from(priority) < LANES => {
                    let queue = &mut st.lanes[usize::from(priority)];
                    if queue.len() == queue.capacity() {
                        // Grow once for whatever is left of the batch rather than doubling.
                        queue.reserve(count - i);
                    }
                    queue.push_back(item);
                }
                Ok((item, priority)) => {
                    stop = Some(Err((item, priority)));
                    break;
                }
                Err(err) => {
                    stop = Some(Ok(err));
                    break;
                }
            }
        }
        if let Some(stop) = stop {
            let taken_out: Vec<VecDeque<T>> = st
                .lanes
                .iter_mut()
                .zip(before)
                .map(|(queue, len)| queue.split_off(len))
                .collect();
            drop(state);
            drop(taken_out);
            return match stop {
                Ok(err) => Err(err),
                Err((item, priority)) => {
                    drop(item);
                    check_priority(priority);
                    unreachable!("priority {priority} passed the range check")
                }
            };
        }
        let mut queued = 0;
        for (lane, (queue, len)) in st.lanes.iter().zip(before).enumerate() {
            if queue.len() > len {
                st.mask |= 1 << lane;
                queued += queue.len() - len;
            }
        }
        st.len += queued;
        drop(state);
        self.notify(queued);
        Ok(true)
    }

    /// Whether a batch of `count` items may go in: the queue is open and,
    /// under [`Overflow::Reject`], has room for all of them.
    #[inline]
    fn check_batch(&self, state: &State<T>, count: usize) -> Result<(), PushError<()>> {
        if state.closed {
            return Err(PushError::Closed(()));
        }
        if self.overflow == Overflow::Reject
            && self
                .capacity
                .is_some_and(|cap| count > cap.saturating_sub(state.len))
        {
            return Err(PushError::Full(()));
        }
        Ok(())
    }

    /// Queue a checked batch of (at most) `count` items, `per_lane` of them in
    /// each lane; the items shed, in the order they were dropped.
    #[inline]
    fn queue_batch(
        &self,
        state: &mut State<T>,
        per_lane: [usize; LANES],
        count: usize,
        items: impl Iterator<Item = (T, u8)>,
    ) -> Vec<T> {
        let mut dropped = Vec::new();
        if self
            .capacity
            .is_none_or(|cap| count <= cap.saturating_sub(state.len))
        {
            // Room for the whole batch: no admission decision per item, and
            // each lane grows once.
            for (queue, extra) in state.lanes.iter_mut().zip(per_lane) {
                if extra > 0 {
                    queue.reserve(extra);
                }
            }
            let before: usize = state.lanes.iter().map(VecDeque::len).sum();
            for (item, priority) in items {
                state.lanes[usize::from(priority)].push_back(item);
            }
            // The mask and length from the lanes, once: right even for fewer items than counted.
            let mut mask = 0u8;
            let mut after = 0usize;
            for (lane, queue) in state.lanes.iter().enumerate() {
                if !queue.is_empty() {
                    mask |= 1 << lane;
                }
                after += queue.len();
            }
            state.mask = mask;
            state.len += after - before;
            return dropped;
        }
        for (item, priority) in items {
            match state.admit(item, priority, self.capacity, self.overflow) {
                Admit::Queued => {}
                Admit::Shed(victim) => dropped.push(victim),
                Admit::Refused(_) => unreachable!("checked above: open, and room under reject"),
            }
        }
        dropped
    }

    /// Queue several items under one lock, admitting each on its own (the ingestor's call).
    ///
    /// Each item refused (full under [`Overflow::Reject`], or closed) is passed
    /// to `on_refused` with its index in `items`; the items dropped by
    /// [`Overflow::Shed`] are returned. `items` is collected before the lock is
    /// taken and `on_refused` is called after it is released, so neither runs
    /// under the lock.
    ///
    /// # Panics
    ///
    /// If a priority is above 5 (before anything is queued).
    pub fn push_each(
        &self,
        items: impl IntoIterator<Item = (T, u8)>,
        mut on_refused: impl FnMut(usize, PushError<T>),
    ) -> Vec<T> {
        let items: Vec<(T, u8)> = items.into_iter().collect();
        // Counted (and checked) before the lock is taken.
        let per_lane = lane_counts(items.iter().map(|&(_, priority)| priority));
        let count = items.len();
        let mut state = self.state.lock();
        if !state.closed
            && self
                .capacity
                .is_none_or(|cap| count <= cap.saturating_sub(state.len))
        {
            // The usual case: the whole batch fits, so no item is refused or
            // shed and each lane grows once, with no decision per item.
            let dropped = self.queue_batch(&mut state, per_lane, count, items.into_iter());
            drop(state);
            self.notify(count);
            return dropped;
        }
        let mut refused = Vec::new();
        let mut dropped = Vec::new();
        let mut queued = 0usize;
        for (index, (item, priority)) in items.into_iter().enumerate() {
            match state.admit(item, priority, self.capacity, self.overflow) {
                Admit::Queued => queued += 1,
                Admit::Shed(victim) => {
                    queued += 1;
                    dropped.push(victim);
                }
                Admit::Refused(err) => refused.push((index, err)),
            }
        }
        drop(state);
        self.notify(queued);
        for (index, err) in refused {
            on_refused(index, err);
        }
        dropped
    }

    /// Wake consumers after `count` items went in.
    #[inline]
    fn notify(&self, count: usize) {
        match count {
            0 => {}
            1 => {
                self.not_empty.notify_one();
            }
            _ => {
                self.not_empty.notify_all();
            }
        }
    }

    /// The next item, or `None` when the queue is empty.
    pub fn try_pop(&self) -> Option<T> {
        self.state.lock().pop(self.starvation_limit)
    }

    /// The next item, waiting up to `timeout` for one (`None`: no limit).
    ///
    /// Returns `None` when the time is up, or at once when the queue is closed and empty.
    pub fn pop_timeout(&self, timeout: Option<Duration>) -> Option<T> {
        let mut state = self.wait_for_item(timeout);
        state.pop(self.starvation_limit)
    }

    /// Up to `n` items in the order single pops would give them.
    pub fn try_pop_many(&self, n: usize) -> Vec<T> {
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        let mut state = self.state.lock();
        out.reserve(n.min(state.len));
        state.pop_many(n, self.starvation_limit, &mut out);
        out
    }

    /// Up to `n` items, waiting up to `timeout` (`None`: no limit) for the first one only.
    ///
    /// Returns an empty vector when the time is up, or at once when the queue
    /// is closed and empty, or when `n` is 0.
    pub fn pop_many_timeout(&self, n: usize, timeout: Option<Duration>) -> Vec<T> {
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        let mut state = self.wait_for_item(timeout);
        out.reserve(n.min(state.len));
        state.pop_many(n, self.starvation_limit, &mut out);
        out
    }

    /// Lock the state once it holds an item, is closed, or `timeout` has passed.
    fn wait_for_item(&self, timeout: Option<Duration>) -> MutexGuard<'_, State<T>> {
        // A timeout too large to add to now is the same as no limit.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut state = self.state.lock();
        loop {
            if state.mask != 0 || state.closed {
                return state;
            }
            match deadline {
                Some(deadline) => {
                    if Instant::now() >= deadline {
                        return state;
                    }
                    // Whether or not the wait timed out, look at the state again:
                    // an item pushed at the last moment is still taken.
                    let _ = self.not_empty.wait_until(&mut state, deadline);
                }
                None => self.not_empty.wait(&mut state),
            }
        }
    }

    /// Call `f` on every queued item (in no set order), or return `None` at once
    /// when another thread holds the lock.
    ///
    /// For a garbage collector's traversal, which must neither block nor run
    /// interpreter code: reporting nothing is safe there, blocking is not.
    pub fn try_for_each<E>(&self, mut f: impl FnMut(&T) -> Result<(), E>) -> Option<Result<(), E>> {
        let state = self.state.try_lock()?;
        Some(state.lanes.iter().flatten().try_for_each(&mut f))
    }

    /// How many items are queued.
    pub fn len(&self) -> usize {
        self.state.lock().len
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.state.lock().len == 0
    }

    /// How many items wait at each priority, 0..=5.
    pub fn depths(&self) -> [usize; LANES] {
        let state = self.state.lock();
        std::array::from_fn(|p| state.lanes[p].len())
    }

    /// Refuse further pushes and wake every waiting consumer; queued items can still be popped.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.not_empty.notify_all();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// How many items the shed policy has dropped so far.
    pub fn shed_count(&self) -> u64 {
        self.state.lock().shed_count
    }

    /// The bound on the number of items, if any.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// What a push does when the queue is full.
    pub fn overflow(&self) -> Overflow {
        self.overflow
    }

    /// The aging limit, if aging is on.
    pub fn starvation_limit(&self) -> Option<u32> {
        self.starvation_limit
    }
}

#[cfg(test)]
mod tests;
