//! Unit tests of the priority queue: ordering, overflow, aging, closing and blocking pops.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

mod aging;

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
