//! The state behind a queue's lock: the six lanes, the bitmask of the
//! non-empty ones and the aging counters, with the overflow (shedding) and
//! aging rules of the parent module's documentation applied to them.

use std::collections::VecDeque;

use super::{Overflow, PushError, LANES};

/// What the lock protects.
pub(super) struct State<T> {
    pub(super) lanes: [VecDeque<T>; LANES],
    /// Bit `p` is set when lane `p` is non-empty.
    pub(super) mask: u8,
    pub(super) len: usize,
    /// How many consecutive pops passed each lane over (kept only with aging).
    passed_over: [u32; LANES],
    pub(super) closed: bool,
    pub(super) shed_count: u64,
}

/// The outcome of admitting one item under the lock.
pub(super) enum Admit<T> {
    /// Queued; nothing dropped.
    Queued,
    /// Queued (unless the dropped item is the incoming one) and one item shed.
    Shed(T),
    Refused(PushError<T>),
}

impl<T> State<T> {
    pub(super) fn new() -> Self {
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
    pub(super) fn enqueue(&mut self, item: T, priority: u8) {
        let p = usize::from(priority);
        self.lanes[p].push_back(item);
        self.mask |= 1 << p;
        self.len += 1;
    }

    /// Admit one item under the queue's capacity and policy.
    #[inline]
    pub(super) fn admit(
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
    pub(super) fn pop(&mut self, starvation_limit: Option<u32>) -> Option<T> {
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

    pub(super) fn pop_many(&mut self, n: usize, starvation_limit: Option<u32>, out: &mut Vec<T>) {
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
