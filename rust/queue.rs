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

/// What the lock protects.
struct State<T> {
    lanes: [VecDeque<T>; LANES],
    /// Bit `p` is set when lane `p` is non-empty.
    mask: u8,
    len: usize,
    /// How many consecutive pops passed each lane over (kept only with aging).
    passed_over: [u32; LANES],
    closed: bool,
    shed_count: u64,
}

/// The outcome of admitting one item under the lock.
enum Admit<T> {
    /// Queued; nothing dropped.
    Queued,
    /// Queued (unless the dropped item is the incoming one) and one item shed.
    Shed(T),
    Refused(PushError<T>),
}

impl<T> State<T> {
    fn new() -> Self {
        State {
            lanes: std::array::from_fn(|_| VecDeque::new()),
            mask: 0,
            len: 0,
            passed_over: [0; LANES],
            closed: false,
            shed_count: 0,
        }
    }

    #[inline]
    fn enqueue(&mut self, item: T, priority: u8) {
        let p = usize::from(priority);
        self.lanes[p].push_back(item);
        self.mask |= 1 << p;
        self.len += 1;
    }

    /// Admit one item under the queue's capacity and policy.
    #[inline]
    fn admit(
        &mut self,
        item: T,
        priority: u8,
        capacity: Option<usize>,
        overflow: Overflow,
    ) -> Admit<T> {
        if self.closed {
            return Admit::Refused(PushError::Closed(item));
        }
        match capacity {
            Some(cap) if self.len >= cap => match overflow {
                Overflow::Reject => Admit::Refused(PushError::Full(item)),
                Overflow::Shed => {
                    self.shed_count += 1;
                    Admit::Shed(self.shed_for(item, priority))
                }
            },
            _ => {
                self.enqueue(item, priority);
                Admit::Queued
            }
        }
    }

    /// At capacity under the shed policy: queue `item` in place of the victim and return the victim.
    fn shed_for(&mut self, item: T, priority: u8) -> T {
        if self.mask == 0 {
            // Capacity 0: nothing to drop but the incoming item.
            return item;
        }
        let lowest = 7 - self.mask.leading_zeros() as usize;
        if usize::from(priority) >= lowest {
            return item;
        }
        let victim = self.lanes[lowest]
            .pop_back()
            .expect("a lane in the mask is non-empty");
        if self.lanes[lowest].is_empty() {
            self.mask &= !(1 << lowest);
            self.passed_over[lowest] = 0;
        }
        let p = usize::from(priority);
        self.lanes[p].push_back(item);
        self.mask |= 1 << p;
        victim
    }

    /// Choose the lane to serve (the mask must be non-empty) and update the aging counters.
    #[inline]
    fn choose_lane(&mut self, starvation_limit: Option<u32>) -> usize {
        let first = self.mask.trailing_zeros() as usize;
        let Some(limit) = starvation_limit else {
            return first;
        };
        let mut aged = 0u8;
        let mut bits = self.mask;
        while bits != 0 {
            let l = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if self.passed_over[l] >= limit {
                aged |= 1 << l;
            }
        }
        let chosen = if aged == 0 {
            first
        } else {
            aged.trailing_zeros() as usize
        };
        self.passed_over[chosen] = 0;
        // Every non-empty lane numbered above the chosen one was passed over.
        let mut above = self.mask & !((2u8 << chosen) - 1);
        while above != 0 {
            let l = above.trailing_zeros() as usize;
            above &= above - 1;
            self.passed_over[l] = self.passed_over[l].saturating_add(1);
        }
        chosen
    }

    #[inline]
    fn pop(&mut self, starvation_limit: Option<u32>) -> Option<T> {
        if self.mask == 0 {
            return None;
        }
        let lane = self.choose_lane(starvation_limit);
        let item = self.lanes[lane].pop_front();
        debug_assert!(item.is_some(), "a lane in the mask is non-empty");
        if self.lanes[lane].is_empty() {
            self.mask &= !(1 << lane);
            self.passed_over[lane] = 0;
        }
        self.len -= 1;
        item
    }

    fn pop_many(&mut self, n: usize, starvation_limit: Option<u32>, out: &mut Vec<T>) {
        if starvation_limit.is_none() {
            // Strict priority: take whole runs from each lane in turn.
            let mut want = n;
            while want > 0 && self.mask != 0 {
                let lane = self.mask.trailing_zeros() as usize;
                let queue = &mut self.lanes[lane];
                let take = want.min(queue.len());
                out.extend(queue.drain(..take));
                if queue.is_empty() {
                    self.mask &= !(1 << lane);
                }
                self.len -= take;
                want -= take;
            }
        } else {
            for _ in 0..n {
                match self.pop(starvation_limit) {
                    Some(item) => out.push(item),
                    None => break,
                }
            }
        }
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    fn unbounded() -> PriorityQueue<u32> {
        PriorityQueue::new(None, Overflow::Reject, None)
    }

    fn drain<T>(q: &PriorityQueue<T>) -> Vec<T> {
        std::iter::from_fn(|| q.try_pop()).collect()
    }

    #[test]
    fn empty_queue() {
        let q = unbounded();
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
        assert_eq!(q.try_pop(), None);
        assert!(q.try_pop_many(10).is_empty());
        assert_eq!(q.depths(), [0; LANES]);
        assert_eq!(q.shed_count(), 0);
        assert!(!q.is_closed());
        assert_eq!(q.capacity(), None);
        assert_eq!(q.overflow(), Overflow::Reject);
        assert_eq!(q.starvation_limit(), None);
    }

    #[test]
    fn priority_order_and_fifo_within_a_priority() {
        let q = unbounded();
        let pushes = [
            (10, 3),
            (11, 5),
            (12, 0),
            (13, 3),
            (14, 0),
            (15, 1),
            (16, 5),
            (17, 2),
            (18, 4),
        ];
        for (item, p) in pushes {
            assert!(matches!(q.push(item, p), Ok(None)));
        }
        assert_eq!(q.len(), 9);
        assert_eq!(q.depths(), [2, 1, 1, 2, 1, 2]);
        assert_eq!(drain(&q), vec![12, 14, 15, 17, 10, 13, 18, 11, 16]);
        assert!(q.is_empty());
    }

    #[test]
    fn interleaved_push_pop_keeps_mask_consistent() {
        let q = unbounded();
        q.push(1, 4).unwrap();
        assert_eq!(q.try_pop(), Some(1));
        assert_eq!(q.try_pop(), None);
        q.push(2, 4).unwrap();
        q.push(3, 2).unwrap();
        assert_eq!(q.try_pop(), Some(3));
        q.push(4, 5).unwrap();
        assert_eq!(q.try_pop(), Some(2));
        assert_eq!(q.try_pop(), Some(4));
        assert_eq!(q.try_pop(), None);
        assert_eq!(q.depths(), [0; LANES]);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn priority_above_five_panics() {
        let q = unbounded();
        let _ = q.push(1, 6);
    }

    #[test]
    fn reject_at_capacity_returns_the_item() {
        let q = PriorityQueue::new(Some(2), Overflow::Reject, None);
        q.push(1, 3).unwrap();
        q.push(2, 3).unwrap();
        match q.push(3, 0) {
            Err(PushError::Full(item)) => assert_eq!(item, 3),
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(q.len(), 2);
        assert_eq!(q.shed_count(), 0);
        assert_eq!(q.try_pop(), Some(1));
        q.push(4, 0).unwrap();
        assert_eq!(drain(&q), vec![4, 2]);
    }

    #[test]
    fn capacity_zero() {
        let q = PriorityQueue::new(Some(0), Overflow::Reject, None);
        assert!(matches!(q.push(1, 0), Err(PushError::Full(1))));
        let q = PriorityQueue::new(Some(0), Overflow::Shed, None);
        assert!(matches!(q.push(1, 0), Ok(Some(1))));
        assert_eq!(q.shed_count(), 1);
        assert!(q.is_empty());
    }

    #[test]
    fn shed_drops_the_newest_of_the_lowest_priority() {
        let q = PriorityQueue::new(Some(3), Overflow::Shed, None);
        q.push(1, 4).unwrap();
        q.push(2, 4).unwrap();
        q.push(3, 1).unwrap();
        // Incoming priority 2 beats lane 4: its newest (2) goes.
        assert!(matches!(q.push(4, 2), Ok(Some(2))));
        assert_eq!(q.depths(), [0, 1, 1, 0, 1, 0]);
        // Incoming priority 4 equals the lowest lane: the incoming item goes.
        assert!(matches!(q.push(5, 4), Ok(Some(5))));
        // Incoming priority 5 is below every lane: the incoming item goes.
        assert!(matches!(q.push(6, 5), Ok(Some(6))));
        // Incoming priority 0: lane 4's only item goes and lane 4 empties.
        assert!(matches!(q.push(7, 0), Ok(Some(1))));
        assert_eq!(q.depths(), [1, 1, 1, 0, 0, 0]);
        // Now the lowest lane is 2.
        assert!(matches!(q.push(8, 1), Ok(Some(4))));
        assert_eq!(q.shed_count(), 5);
        assert_eq!(q.len(), 3);
        assert_eq!(drain(&q), vec![7, 3, 8]);
    }

    #[test]
    fn lane_counts_across_chunks() {
        for n in [0usize, 1, 1022, 1023, 1024, 5000] {
            let priorities: Vec<u8> = (0..n).map(|i| ((i * 7 + i / 3) % LANES) as u8).collect();
            let mut expected = [0usize; LANES];
            for &p in &priorities {
                expected[usize::from(p)] += 1;
            }
            assert_eq!(lane_counts(priorities.into_iter()), expected, "{n} items");
        }
        let all_one_lane = lane_counts(std::iter::repeat_n(5u8, 3000));
        assert_eq!(all_one_lane, [0, 0, 0, 0, 0, 3000]);
    }

    #[test]
    fn push_many_reject_is_all_or_nothing() {
        let q = PriorityQueue::new(Some(4), Overflow::Reject, None);
        q.push(0, 0).unwrap();
        match q.push_many(vec![(1, 1), (2, 2), (3, 3), (4, 4)]) {
            Err(PushError::Full(items)) => assert_eq!(items, vec![(1, 1), (2, 2), (3, 3), (4, 4)]),
            other => panic!("expected Full, got {:?}", other.map(|_| ())),
        }
        assert_eq!(q.len(), 1);
        assert_eq!(
            q.push_many(vec![(1, 1), (2, 5), (3, 0)]).unwrap(),
            Vec::<u32>::new()
        );
        assert_eq!(q.len(), 4);
        assert!(q.push_many(vec![]).unwrap().is_empty());
        assert_eq!(drain(&q), vec![0, 3, 1, 2]);
    }

    #[test]
    fn push_many_shed_returns_dropped_in_order() {
        let q = PriorityQueue::new(Some(2), Overflow::Shed, None);
        let dropped = q
            .push_many(vec![(1, 5), (2, 5), (3, 0), (4, 5), (5, 0), (6, 0)])
            .unwrap();
        // 3 displaces 2; 4 sheds itself; 5 displaces 1; 6 sheds itself (lane 0 is the lowest).
        assert_eq!(dropped, vec![2, 4, 1, 6]);
        assert_eq!(q.shed_count(), 4);
        assert_eq!(drain(&q), vec![3, 5]);
    }

    #[test]
    fn push_many_fitting_queues_in_priority_order() {
        let q = unbounded();
        q.push(100, 3).unwrap();
        let items = (0..60u32).map(|i| Ok::<_, ()>((i, (i % 6) as u8)));
        assert_eq!(q.push_many_fitting(60, items), Ok(true));
        assert_eq!(q.len(), 61);
        assert_eq!(q.depths(), [10, 10, 10, 11, 10, 10]);
        let out = q.try_pop_many(100);
        let mut expected: Vec<u32> = Vec::new();
        for p in 0..6 {
            if p == 3 {
                expected.push(100);
            }
            expected.extend((0..10).map(|k| p + 6 * k));
        }
        assert_eq!(out, expected);
        assert!(q.is_empty());
    }

    #[test]
    fn push_many_fitting_takes_the_batch_out_on_an_error() {
        let q = unbounded();
        q.push_many(vec![(1, 0), (2, 4)]).unwrap();
        let items = [Ok((3, 0)), Ok((4, 4)), Ok((5, 2)), Err("bad"), Ok((6, 1))];
        assert_eq!(q.push_many_fitting(5, items), Err("bad"));
        assert_eq!(q.len(), 2);
        assert_eq!(q.depths(), [1, 0, 0, 0, 1, 0]);
        assert_eq!(drain(&q), vec![1, 2]);
        // The mask was left as it was: an emptied queue reports nothing.
        assert_eq!(q.try_pop(), None);
    }

    #[test]
    fn push_many_fitting_drops_what_it_takes_out() {
        let q: PriorityQueue<Arc<u32>> = PriorityQueue::new(None, Overflow::Reject, None);
        let item = Arc::new(7);
        let items = [Ok((Arc::clone(&item), 1)), Err(())];
        assert_eq!(q.push_many_fitting(2, items), Err(()));
        assert_eq!(Arc::strong_count(&item), 1);
    }

    #[test]
    fn push_many_fitting_leaves_a_batch_that_does_not_fit_unread() {
        for overflow in [Overflow::Reject, Overflow::Shed] {
            let q = PriorityQueue::new(Some(3), overflow, None);
            q.push(1, 0).unwrap();
            let mut read = 0;
            let items = (0..3).map(|i| {
                read += 1;
                Ok::<_, ()>((i, 0))
            });
            assert_eq!(q.push_many_fitting(3, items), Ok(false));
            assert_eq!(read, 0);
            assert_eq!(
                q.push_many_fitting(2, [Ok::<_, ()>((2, 1)), Ok((3, 0))]),
                Ok(true)
            );
            assert_eq!(drain(&q), vec![1, 3, 2]);
        }
        let q = unbounded();
        q.close();
        assert_eq!(q.push_many_fitting(1, [Ok::<_, ()>((1, 0))]), Ok(false));
        assert!(q.is_empty());
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn push_many_fitting_checks_priorities() {
        let q = unbounded();
        let _ = q.push_many_fitting(2, [Ok::<_, ()>((1, 0)), Ok((2, 6))]);
    }

    #[test]
    fn push_many_in_lanes_applies_the_policy() {
        let q = PriorityQueue::new(Some(3), Overflow::Shed, None);
        q.push_many_in_lanes(&[5, 5], [1, 2]).unwrap();
        assert_eq!(
            q.push_many_in_lanes(&[1, 0, 5], [3, 4, 5]).unwrap(),
            vec![2, 5]
        );
        assert_eq!(drain(&q), vec![4, 3, 1]);
        let q = PriorityQueue::new(Some(2), Overflow::Reject, None);
        assert!(matches!(
            q.push_many_in_lanes(&[0, 0, 0], [1, 2, 3]),
            Err(PushError::Full(()))
        ));
        assert!(q.is_empty());
        // Fewer items than lanes: what came is queued, and counted right.
        assert!(q.push_many_in_lanes(&[2, 1], [1]).unwrap().is_empty());
        assert_eq!(q.len(), 1);
        assert_eq!(q.depths(), [0, 0, 1, 0, 0, 0]);
        q.close();
        assert!(matches!(
            q.push_many_in_lanes(&[], std::iter::empty()),
            Err(PushError::Closed(()))
        ));
    }

    #[test]
    fn push_many_unbounded() {
        let q = unbounded();
        let items: Vec<(u32, u8)> = (0..60).map(|i| (i, (i % 6) as u8)).collect();
        assert!(q.push_many(items).unwrap().is_empty());
        assert_eq!(q.depths(), [10; LANES]);
        let out = q.try_pop_many(100);
        let expected: Vec<u32> = (0..6)
            .flat_map(|p| (0..10).map(move |k| p + 6 * k))
            .collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn push_each_reports_refusals_by_index() {
        let q = PriorityQueue::new(Some(2), Overflow::Reject, None);
        let mut refused = Vec::new();
        let dropped = q.push_each(vec![(1, 0), (2, 1), (3, 2)], |i, e| {
            assert!(!e.is_closed());
            refused.push((i, e.into_inner()));
        });
        assert!(dropped.is_empty());
        assert_eq!(refused, vec![(2, 3)]);
        assert_eq!(q.try_pop(), Some(1));
        // Per-item admission: a freed slot is used by the next item that comes.
        let mut refused = Vec::new();
        q.push_each([(4, 5), (5, 5)], |i, e| refused.push((i, e.into_inner())));
        assert_eq!(refused, vec![(1, 5)]);
        q.close();
        let mut refused = Vec::new();
        q.push_each([(6, 0)], |i, e| {
            assert!(e.is_closed());
            refused.push((i, e.into_inner()));
        });
        assert_eq!(refused, vec![(0, 6)]);
        assert_eq!(drain(&q), vec![2, 4]);
    }

    /// A batch through `push_each` (whole when it fits, item by item when
    /// not) ends as the same items pushed one by one with `push`: the same
    /// order in every lane, the same refusals and sheds, the same depths.
    #[test]
    fn push_each_is_push_item_by_item() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..400u32 {
            let capacity = match round % 3 {
                0 => None,
                _ => Some((next() % 40) as usize),
            };
            let overflow = if round % 2 == 0 {
                Overflow::Reject
            } else {
                Overflow::Shed
            };
            let (batched, single) = (
                PriorityQueue::new(capacity, overflow, None),
                PriorityQueue::new(capacity, overflow, None),
            );
            let mut item = 0u32;
            for _ in 0..6 {
                if next() % 8 == 0 {
                    batched.close();
                    single.close();
                }
                let batch: Vec<(u32, u8)> = (0..next() % 30)
                    .map(|_| {
                        item += 1;
                        (item, (next() % 6) as u8)
                    })
                    .collect();
                let mut refused = Vec::new();
                let dropped = batched.push_each(batch.clone(), |i, e| {
                    refused.push((i, e.is_closed(), e.into_inner()));
                });
                let (mut want_refused, mut want_dropped) = (Vec::new(), Vec::new());
                for (i, (it, priority)) in batch.into_iter().enumerate() {
                    match single.push(it, priority) {
                        Ok(Some(victim)) => want_dropped.push(victim),
                        Ok(None) => {}
                        Err(e) => want_refused.push((i, e.is_closed(), e.into_inner())),
                    }
                }
                assert_eq!(refused, want_refused, "round {round}");
                assert_eq!(dropped, want_dropped, "round {round}");
                assert_eq!(batched.depths(), single.depths(), "round {round}");
                assert_eq!(batched.len(), single.len());
                assert_eq!(batched.shed_count(), single.shed_count());
                // Pop a few, so later batches meet a queue partly full.
                for _ in 0..next() % 10 {
                    assert_eq!(batched.try_pop(), single.try_pop());
                }
            }
            assert_eq!(drain(&batched), drain(&single), "round {round}");
        }
    }

    #[test]
    fn push_each_shed_returns_dropped() {
        let q = PriorityQueue::new(Some(1), Overflow::Shed, None);
        let mut calls = 0;
        let dropped = q.push_each((0..4).map(|i| (i, 3 - i as u8)), |_, _| calls += 1);
        assert_eq!(calls, 0);
        assert_eq!(dropped, vec![0, 1, 2]);
        assert_eq!(q.try_pop(), Some(3));
        assert_eq!(q.shed_count(), 3);
    }

    #[test]
    fn close_refuses_pushes_and_drains() {
        let q = unbounded();
        q.push(1, 2).unwrap();
        q.push(2, 0).unwrap();
        q.close();
        assert!(q.is_closed());
        assert!(matches!(q.push(3, 0), Err(PushError::Closed(3))));
        match q.push_many(vec![(4, 0)]) {
            Err(PushError::Closed(items)) => assert_eq!(items, vec![(4, 0)]),
            other => panic!("expected Closed, got {:?}", other.map(|_| ())),
        }
        assert!(matches!(q.push_many(vec![]), Err(PushError::Closed(_))));
        assert_eq!(q.pop_timeout(None), Some(2));
        assert_eq!(q.pop_many_timeout(5, None), vec![1]);
        // Closed and empty: no waiting, even without a limit.
        assert_eq!(q.pop_timeout(None), None);
        assert!(q.pop_many_timeout(5, None).is_empty());
    }

    #[test]
    fn closed_takes_precedence_over_full() {
        let q = PriorityQueue::new(Some(1), Overflow::Reject, None);
        q.push(1, 0).unwrap();
        q.close();
        assert!(matches!(q.push(2, 0), Err(PushError::Closed(2))));
        assert!(matches!(
            q.push_many(vec![(3, 0), (4, 0)]),
            Err(PushError::Closed(_))
        ));
    }

    #[test]
    fn pop_many_respects_n_and_order() {
        let q = unbounded();
        for i in 0..5 {
            q.push(i, 5).unwrap();
            q.push(100 + i, 1).unwrap();
        }
        assert!(q.try_pop_many(0).is_empty());
        assert_eq!(q.try_pop_many(3), vec![100, 101, 102]);
        assert_eq!(q.try_pop_many(4), vec![103, 104, 0, 1]);
        assert_eq!(q.depths(), [0, 0, 0, 0, 0, 3]);
        assert_eq!(q.pop_many_timeout(10, Some(Duration::ZERO)), vec![2, 3, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn timeouts_return_none_when_nothing_comes() {
        let q = unbounded();
        assert_eq!(q.pop_timeout(Some(Duration::ZERO)), None);
        assert_eq!(q.pop_timeout(Some(Duration::from_millis(5))), None);
        assert!(q
            .pop_many_timeout(3, Some(Duration::from_millis(5)))
            .is_empty());
        assert!(q.pop_many_timeout(0, None).is_empty());
    }

    #[test]
    fn huge_timeout_is_no_limit() {
        let q = Arc::new(unbounded());
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.pop_timeout(Some(Duration::MAX)))
        };
        thread::sleep(Duration::from_millis(10));
        q.push(7, 3).unwrap();
        assert_eq!(consumer.join().unwrap(), Some(7));
    }

    #[test]
    fn blocked_pop_wakes_on_push() {
        let q = Arc::new(unbounded());
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.pop_timeout(None))
        };
        thread::sleep(Duration::from_millis(20));
        q.push(42, 5).unwrap();
        assert_eq!(consumer.join().unwrap(), Some(42));
    }

    #[test]
    fn blocked_pops_wake_on_close() {
        let q: Arc<PriorityQueue<u32>> = Arc::new(unbounded());
        let consumers: Vec<_> = (0..4)
            .map(|i| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    if i % 2 == 0 {
                        q.pop_timeout(None).is_none()
                    } else {
                        q.pop_many_timeout(3, None).is_empty()
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        q.close();
        for c in consumers {
            assert!(c.join().unwrap());
        }
    }

    #[test]
    fn batch_push_wakes_every_waiter() {
        let q = Arc::new(unbounded());
        let consumers: Vec<_> = (0..4)
            .map(|_| {
                let q = Arc::clone(&q);
                thread::spawn(move || q.pop_timeout(None))
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        q.push_many(vec![(1, 0), (2, 1), (3, 2), (4, 3)]).unwrap();
        let mut got: Vec<u32> = consumers
            .into_iter()
            .map(|c| c.join().unwrap().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 4]);
    }

    #[test]
    fn many_producers_and_consumers_lose_nothing() {
        const PRODUCERS: u32 = 4;
        const PER_PRODUCER: u32 = 5_000;
        let q = Arc::new(PriorityQueue::new(Some(64), Overflow::Reject, Some(3)));
        let popped = Arc::new(AtomicUsize::new(0));
        let consumers: Vec<_> = (0..3)
            .map(|c| {
                let q = Arc::clone(&q);
                let popped = Arc::clone(&popped);
                thread::spawn(move || {
                    let mut seen = Vec::new();
                    loop {
                        let batch = if c == 0 {
                            q.pop_timeout(None).into_iter().collect()
                        } else {
                            q.pop_many_timeout(7, None)
                        };
                        if batch.is_empty() {
                            return seen;
                        }
                        popped.fetch_add(batch.len(), Ordering::Relaxed);
                        seen.extend(batch);
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    for i in 0..PER_PRODUCER {
                        let mut item = p * PER_PRODUCER + i;
                        loop {
                            match q.push(item, (item % 6) as u8) {
                                Ok(_) => break,
                                Err(e) => {
                                    item = e.into_inner();
                                    thread::yield_now();
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        q.close();
        let mut all: Vec<u32> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..PRODUCERS * PER_PRODUCER).collect::<Vec<_>>());
        assert_eq!(
            popped.load(Ordering::Relaxed),
            (PRODUCERS * PER_PRODUCER) as usize
        );
    }

    #[test]
    fn per_producer_fifo_within_a_priority_under_concurrency() {
        let q = Arc::new(unbounded());
        let producers: Vec<_> = (0..3u32)
            .map(|p| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    for i in 0..2_000u32 {
                        q.push(p << 16 | i, 2).unwrap();
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut last = [None::<u32>; 3];
        for item in drain(&q) {
            let p = (item >> 16) as usize;
            let i = item & 0xffff;
            assert!(last[p].is_none_or(|prev| prev < i));
            last[p] = Some(i);
        }
    }

    /// A straightforward model of the aging rule, for checking the queue against.
    struct Model {
        lanes: [VecDeque<u32>; LANES],
        counters: [u32; LANES],
        limit: Option<u32>,
    }

    impl Model {
        fn pop(&mut self) -> Option<u32> {
            let non_empty: Vec<usize> = (0..LANES).filter(|&l| !self.lanes[l].is_empty()).collect();
            let first = *non_empty.first()?;
            let chosen = match self.limit {
                None => first,
                Some(k) => non_empty
                    .iter()
                    .copied()
                    .find(|&l| self.counters[l] >= k)
                    .unwrap_or(first),
            };
            if self.limit.is_some() {
                self.counters[chosen] = 0;
                for &l in &non_empty {
                    if l > chosen {
                        self.counters[l] += 1;
                    }
                }
            }
            let item = self.lanes[chosen].pop_front();
            if self.lanes[chosen].is_empty() {
                self.counters[chosen] = 0;
            }
            item
        }
    }

    #[test]
    fn aging_serves_a_starved_lane() {
        let q = PriorityQueue::new(None, Overflow::Reject, Some(2));
        for i in 0..6 {
            q.push(i, 0).unwrap();
        }
        q.push(100, 5).unwrap();
        // Pops 1 and 2 pass lane 5 over; the third pop serves it.
        assert_eq!(q.try_pop(), Some(0));
        assert_eq!(q.try_pop(), Some(1));
        assert_eq!(q.try_pop(), Some(100));
        assert_eq!(drain(&q), vec![2, 3, 4, 5]);
    }

    #[test]
    fn aging_lowest_numbered_aged_lane_first_and_counters_reset() {
        let q = PriorityQueue::new(None, Overflow::Reject, Some(1));
        for i in 0..4 {
            q.push(i, 0).unwrap();
        }
        q.push(30, 3).unwrap();
        q.push(31, 3).unwrap();
        q.push(50, 5).unwrap();
        // Pop 1: lane 0 (no lane aged); lanes 3 and 5 reach 1.
        assert_eq!(q.try_pop(), Some(0));
        // Pop 2: lanes 3 and 5 are aged; lane 3 is the lowest-numbered: lane 5 reaches 2.
        assert_eq!(q.try_pop(), Some(30));
        // Pop 3: lane 5 is aged (2 >= 1); lane 3 (counter 0) is below it and is not counted.
        assert_eq!(q.try_pop(), Some(50));
        // Pop 4: nothing aged: lane 0; lane 3 reaches 1.
        assert_eq!(q.try_pop(), Some(1));
        // Pop 5: lane 3 aged.
        assert_eq!(q.try_pop(), Some(31));
        assert_eq!(drain(&q), vec![2, 3]);
    }

    #[test]
    fn aging_counter_resets_when_a_lane_empties() {
        let q = PriorityQueue::new(None, Overflow::Reject, Some(2));
        q.push(1, 0).unwrap();
        q.push(2, 0).unwrap();
        q.push(3, 0).unwrap();
        q.push(50, 5).unwrap();
        assert_eq!(q.try_pop(), Some(1)); // lane 5: 1
        assert_eq!(q.try_pop(), Some(2)); // lane 5: 2
        assert_eq!(q.try_pop(), Some(50)); // aged; lane 5 empties
        q.push(51, 5).unwrap();
        q.push(4, 0).unwrap();
        // Lane 5 starts from 0 again.
        assert_eq!(q.try_pop(), Some(3));
        assert_eq!(q.try_pop(), Some(4));
        assert_eq!(q.try_pop(), Some(51));
    }

    #[test]
    fn aging_counter_resets_when_shedding_empties_a_lane() {
        let q = PriorityQueue::new(Some(3), Overflow::Shed, Some(2));
        q.push(1, 0).unwrap();
        q.push(2, 0).unwrap();
        q.push(50, 5).unwrap();
        assert_eq!(q.try_pop(), Some(1)); // lane 5: 1
        q.push(3, 0).unwrap();
        // Full: lane 5's only item is shed, and its counter goes back to 0.
        assert!(matches!(q.push(4, 0), Ok(Some(50))));
        assert_eq!(q.try_pop(), Some(2));
        q.push(51, 5).unwrap();
        assert_eq!(q.try_pop(), Some(3)); // lane 5: 1, not 2
        assert_eq!(q.try_pop(), Some(4)); // lane 5: 2
        assert_eq!(q.try_pop(), Some(51));
    }

    #[test]
    fn aging_zero_limit_is_strict_priority() {
        let q = PriorityQueue::new(None, Overflow::Reject, Some(0));
        q.push(5, 5).unwrap();
        q.push(0, 0).unwrap();
        q.push(1, 0).unwrap();
        assert_eq!(drain(&q), vec![0, 1, 5]);
    }

    /// A deterministic xorshift generator, so the model test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn queue_matches_the_model() {
        for (seed, limit) in [
            (1u64, None),
            (2, Some(1)),
            (3, Some(2)),
            (4, Some(3)),
            (5, Some(7)),
            (6, Some(1)),
        ] {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
            let q = PriorityQueue::new(None, Overflow::Reject, limit);
            let mut model = Model {
                lanes: std::array::from_fn(|_| VecDeque::new()),
                counters: [0; LANES],
                limit,
            };
            let mut next = 0u32;
            for _ in 0..20_000 {
                match rng.below(10) {
                    0..=4 => {
                        let p = rng.below(LANES as u64) as usize;
                        q.push(next, p as u8).unwrap();
                        model.lanes[p].push_back(next);
                        next += 1;
                    }
                    5..=7 => assert_eq!(q.try_pop(), model.pop()),
                    8 => {
                        let n = rng.below(5) as usize;
                        let expected: Vec<u32> = (0..n).map_while(|_| model.pop()).collect();
                        assert_eq!(q.try_pop_many(n), expected);
                    }
                    _ => {
                        let batch: Vec<(u32, u8)> = (0..rng.below(4))
                            .map(|_| {
                                let p = rng.below(LANES as u64) as u8;
                                model.lanes[usize::from(p)].push_back(next);
                                next += 1;
                                (next - 1, p)
                            })
                            .collect();
                        q.push_many(batch).unwrap();
                    }
                }
                let depths: [usize; LANES] = std::array::from_fn(|l| model.lanes[l].len());
                assert_eq!(q.depths(), depths);
                assert_eq!(q.len(), depths.iter().sum::<usize>());
            }
        }
    }

    #[test]
    fn items_are_moved_not_copied() {
        let q: PriorityQueue<Box<str>> = PriorityQueue::new(Some(1), Overflow::Shed, None);
        q.push("a".into(), 2).unwrap();
        let dropped = q.push("b".into(), 1).unwrap();
        assert_eq!(dropped.as_deref(), Some("a"));
        assert_eq!(q.try_pop().as_deref(), Some("b"));
    }

    #[test]
    fn try_for_each_visits_every_item_unless_locked() {
        let q = unbounded();
        q.push_many(vec![(1, 0), (2, 5), (3, 3)]).unwrap();
        let mut seen = Vec::new();
        let r: Option<Result<(), ()>> = q.try_for_each(|&x| {
            seen.push(x);
            Ok(())
        });
        assert_eq!(r, Some(Ok(())));
        seen.sort_unstable();
        assert_eq!(seen, vec![1, 2, 3]);
        assert_eq!(
            q.try_for_each(|&x| if x == 3 { Err(x) } else { Ok(()) }),
            Some(Err(3))
        );
        let guard = q.state.lock();
        assert!(q.try_for_each(|_| Ok::<(), ()>(())).is_none());
        drop(guard);
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn push_checked_refuses_before_admitting_and_queues_what_is_admitted() {
        let q = PriorityQueue::new(Some(2), Overflow::Shed, None);
        let mut asked = 0;
        let mut admit = |answer: bool| {
            asked += 1;
            answer
        };
        assert!(q.push_checked(1, 3, || admit(true)).unwrap());
        assert!(!q.push_checked(2, 0, || admit(false)).unwrap());
        assert!(q.push_checked(3, 0, || admit(true)).unwrap());
        // Full: refused (not shed) before `admit` is asked.
        match q.push_checked(4, 0, || admit(true)) {
            Err(PushError::Full(item)) => assert_eq!(item, 4),
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(asked, 3);
        assert_eq!(q.shed_count(), 0);
        assert_eq!(drain(&q), vec![3, 1]);
        q.close();
        match q.push_checked(5, 0, || true) {
            Err(PushError::Closed(item)) => assert_eq!(item, 5),
            other => panic!("expected Closed, got {other:?}"),
        }
    }

    #[test]
    fn push_error_display_and_debug() {
        let full: PushError<u8> = PushError::Full(1);
        let closed: PushError<u8> = PushError::Closed(2);
        assert_eq!(full.to_string(), "the queue is full");
        assert_eq!(closed.to_string(), "the queue is closed");
        assert_eq!(format!("{full:?}"), "Full(..)");
        assert!(closed.is_closed() && !full.is_closed());
        assert_eq!(closed.into_inner(), 2);
        let q: PriorityQueue<u8> = PriorityQueue::new(Some(3), Overflow::Shed, Some(4));
        let debug = format!("{q:?}");
        assert!(debug.contains("capacity: Some(3)") && debug.contains("Shed"));
    }
}
