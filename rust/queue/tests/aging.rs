//! The aging rule: worked examples, and the queue checked against a model of the rule.

use super::*;

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
