//! Unit tests of the de-duplication window and its snapshots.

use super::snapshot::{HEADER_LEN, MAGIC, MIN_ENTRY_LEN, TAG_OTHER, TAG_UUID, VERSION};
use super::*;

/// A xorshift generator from `seed`: the property tests are reproducible.
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

const U1: &str = "123e4567-e89b-42d3-a456-426614174000";
const U2: &str = "00000000-0000-4000-8000-000000000002";

/// The table-driven parser the SWAR one replaced: the reference for it.
fn uuid_key_reference(b: &[u8]) -> Option<u128> {
    if b.len() != 36 {
        return None;
    }
    let mut v = 0u128;
    for (i, &c) in b.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        v = (v << 4) | u128::from((c as char).to_digit(16)?);
    }
    Some(v)
}

#[test]
fn uuid_key_agrees_with_the_reference_for_every_byte_in_every_place() {
    let base = *b"0a1B2c3D-4e5F-6789-abcd-EF0123456789";
    assert_eq!(uuid_key(base), uuid_key_reference(&base));
    assert!(uuid_key(base).is_some());
    for i in 0..36 {
        for c in 0..=255u8 {
            let mut b = base;
            b[i] = c;
            assert_eq!(uuid_key(b), uuid_key_reference(&b), "byte {c:#x} at {i}");
        }
    }
}

#[test]
fn uuid_key_parses_canonical_form_only() {
    assert_eq!(
        uuid_key(U1),
        Some(0x123e_4567_e89b_42d3_a456_4266_1417_4000)
    );
    assert_eq!(uuid_key(U1.to_uppercase()), uuid_key(U1));
    assert_eq!(uuid_key("00000000-0000-0000-0000-000000000000"), Some(0));
    assert_eq!(
        uuid_key("ffffffff-ffff-ffff-ffff-ffffffffffff"),
        Some(u128::MAX)
    );
    for bad in [
        "",
        "123e4567e89b42d3a456426614174000",
        "{123e4567-e89b-42d3-a456-426614174000}",
        "123e4567-e89b-42d3-a456-42661417400",
        "123e4567-e89b-42d3-a456-4266141740000",
        "123e4567-e89b-42d3-a456_426614174000",
        "123e4567-e89b-42d3-a4566-42661417400",
        "123e4567-e89b-42d3-a456-42661417400g",
        "urn:uuid:123e4567-e89b-42d3-a456-4266",
        "123e4567-e89b-42d3-a456-42661417400\u{e9}",
    ] {
        assert_eq!(uuid_key(bad), None, "{bad:?}");
    }
}

#[test]
fn first_sight_then_duplicate() {
    let mut w = DedupWindow::new(1000, 100);
    assert!(w.is_empty());
    assert!(w.check_and_insert(U1, 0));
    assert!(!w.check_and_insert(U1, 1));
    assert!(!w.check_and_insert(U1.to_uppercase(), 2));
    assert!(w.check_and_insert("plain-id", 3));
    assert!(!w.check_and_insert("plain-id", 4));
    assert!(
        w.check_and_insert("PLAIN-ID", 5),
        "non-UUID ids are case-sensitive"
    );
    assert_eq!(w.len(), 3);
    assert!(w.contains(U1) && w.contains("plain-id") && !w.contains(U2));
}

#[test]
fn uuid_and_non_uuid_ids_do_not_collide() {
    let mut w = DedupWindow::new(1000, 100);
    assert!(w.check_and_insert(U1, 0));
    // Same hex digits, not canonical: a different id.
    assert!(w.check_and_insert(U1.replace('-', ""), 0));
    assert!(w.check_and_insert("", 0));
    assert!(!w.check_and_insert("", 0));
    assert_eq!(w.len(), 3);
}

#[test]
fn window_boundary_is_half_open() {
    let mut w = DedupWindow::new(100, 10);
    assert!(w.check_and_insert("a", 1000));
    assert!(!w.check_and_insert("a", 1099));
    assert!(w.contains("a"));
    assert!(
        w.check_and_insert("a", 1100),
        "t + window_ms is outside the window"
    );
    assert!(!w.check_and_insert("a", 1199));
    assert!(w.check_and_insert("a", 1200));
}

#[test]
fn duplicate_does_not_refresh() {
    let mut w = DedupWindow::new(100, 10);
    assert!(w.check_and_insert("a", 0));
    assert!(!w.check_and_insert("a", 99));
    assert!(w.check_and_insert("a", 100));
}

#[test]
fn time_going_backwards_counts_as_no_time() {
    let mut w = DedupWindow::new(100, 10);
    assert!(w.check_and_insert("a", 1000));
    assert!(w.check_and_insert("b", 500)); // recorded at 1000
    assert!(!w.check_and_insert("a", 0));
    assert_eq!(w.expire(1099), 0);
    assert_eq!(w.expire(1100), 2);
    assert!(w.is_empty());
    assert!(w.check_and_insert("c", -5)); // recorded at 1100
    assert_eq!(w.expire(1199), 0);
    assert_eq!(w.expire(1200), 1);
}

#[test]
fn extreme_times_do_not_overflow() {
    let mut w = DedupWindow::new(u64::MAX, 10);
    assert!(w.check_and_insert("a", i64::MIN));
    assert!(!w.check_and_insert("a", i64::MAX - 1));
    // i64::MIN + u64::MAX == i64::MAX: the end of the window, outside it.
    assert_eq!(w.expire(i64::MAX), 1);
    let mut w = DedupWindow::new(1, 10);
    assert!(w.check_and_insert("a", i64::MIN));
    assert!(!w.check_and_insert("a", i64::MIN));
    assert!(w.check_and_insert("a", i64::MIN + 1));
    assert!(w.check_and_insert("b", i64::MAX));
    assert!(!w.contains("a"));
    assert!(w.contains("b"));
}

#[test]
fn contains_neither_inserts_nor_expires() {
    let mut w = DedupWindow::new(100, 10);
    assert!(!w.contains("a"));
    assert!(w.is_empty());
    w.check_and_insert("a", 0);
    w.check_and_insert("b", 50);
    assert!(w.contains("a"));
    w.expire(120); // drops a
    assert!(!w.contains("a"));
    assert!(w.contains("b"));
    assert_eq!(w.len(), 1);
}

#[test]
fn count_bound_evicts_oldest() {
    let mut w = DedupWindow::new(1_000_000, 3);
    for (i, id) in ["a", U1, "c", U2, "e"].iter().enumerate() {
        assert!(w.check_and_insert(id, i as i64));
    }
    assert_eq!(w.len(), 3);
    assert!(!w.contains("a") && !w.contains(U1));
    assert!(w.contains("c") && w.contains(U2) && w.contains("e"));
    // An evicted id is new again.
    assert!(w.check_and_insert("a", 10));
    assert!(!w.contains("c"));
}

#[test]
fn max_entries_one() {
    let mut w = DedupWindow::new(1000, 1);
    assert!(w.check_and_insert("a", 0));
    assert!(!w.check_and_insert("a", 0));
    assert!(w.check_and_insert("b", 0));
    assert!(w.check_and_insert("a", 0));
    assert_eq!(w.len(), 1);
}

#[test]
#[should_panic(expected = "max_entries")]
fn zero_max_entries_panics() {
    let _ = DedupWindow::new(10, 0);
}

#[test]
#[should_panic(expected = "window_ms")]
fn zero_window_panics() {
    let _ = DedupWindow::new(0, 10);
}

#[test]
fn forget_removes_and_skips_stale_ring_entries() {
    let mut w = DedupWindow::new(100, 2);
    assert!(w.check_and_insert("a", 0));
    assert!(w.check_and_insert(U1, 10));
    assert!(w.forget("a"));
    assert!(!w.forget("a"));
    assert!(!w.contains("a"));
    assert_eq!(w.len(), 1);
    // Re-inserted later: the stale ring entry of the first "a" must not expire it.
    assert!(w.check_and_insert("a", 20));
    assert_eq!(w.expire(100), 0, "the stale entry at 0 is skipped");
    assert!(w.contains("a"));
    assert_eq!(w.expire(110), 1); // U1
    assert_eq!(w.expire(120), 1); // a
    assert!(w.is_empty() && w.ring.is_empty());
    assert!(!w.forget(U1));
}

#[test]
fn forget_then_count_bound_does_not_count_stale_entries() {
    let mut w = DedupWindow::new(1_000_000, 2);
    w.check_and_insert("a", 0);
    w.check_and_insert("b", 1);
    assert!(w.forget("a"));
    w.check_and_insert("c", 2);
    // "a" is stale; b and c are held and nothing was evicted.
    assert!(w.contains("b") && w.contains("c"));
    w.check_and_insert("d", 3);
    assert!(!w.contains("b") && w.contains("c") && w.contains("d"));
}

#[test]
fn forget_newest_pops_the_ring_back() {
    let mut w = DedupWindow::new(1000, 100);
    w.check_and_insert("a", 0);
    w.check_and_insert("b", 0);
    assert!(w.forget("b"));
    assert_eq!(w.ring.len(), 1);
    assert!(w.forget("a"));
    assert!(w.ring.is_empty());
    assert_eq!(w.other_key_bytes, 0);
}

#[test]
fn repeated_forget_keeps_the_ring_bounded() {
    let mut w = DedupWindow::new(u64::MAX, 1_000_000);
    w.check_and_insert("keep", 0);
    for i in 0..10_000 {
        let id = format!("id-{i}");
        assert!(w.check_and_insert(&id, i));
        assert!(w.check_and_insert(format!("x-{i}"), i));
        assert!(w.forget(&id)); // not the newest: leaves a stale entry
    }
    assert_eq!(w.len(), 10_001);
    assert!(w.ring.len() <= 2 * w.len() + 64);
    let live_bytes: usize = w
        .ring
        .iter()
        .map(|e| {
            if let Key::Other(k) = &e.key {
                key_bytes(k.len())
            } else {
                0
            }
        })
        .sum();
    assert_eq!(w.other_key_bytes, live_bytes);
    for i in 0..10_000 {
        assert!(!w.contains(format!("id-{i}")));
        assert!(w.contains(format!("x-{i}")));
    }
}

#[test]
fn clear_keeps_the_clock() {
    let mut w = DedupWindow::new(100, 10);
    w.check_and_insert("a", 1000);
    let before = w.memory_usage();
    w.clear();
    assert!(w.is_empty() && !w.contains("a"));
    assert!(w.memory_usage() < before);
    assert!(w.check_and_insert("a", 0)); // recorded at 1000
    assert!(!w.check_and_insert("a", 1099));
    assert!(w.check_and_insert("a", 1100));
}

#[test]
fn memory_usage_grows_with_entries() {
    let mut w = DedupWindow::new(1000, 1_000_000);
    let empty = w.memory_usage();
    assert!(empty >= size_of::<DedupWindow>());
    for i in 0..1000u128 {
        let id = format!("{i:08x}-0000-4000-8000-{i:012x}");
        w.check_and_insert(&id, 0);
    }
    let uuids = w.memory_usage();
    assert!(uuids >= empty + 1000 * (size_of::<u32>() + size_of::<RingEntry>()));
    w.check_and_insert("x".repeat(10_000), 0);
    assert!(w.memory_usage() >= uuids + 10_000);
}

#[test]
fn accessors() {
    let w = DedupWindow::new(60_000, 1_000_000);
    assert_eq!(w.window_ms(), 60_000);
    assert_eq!(w.max_entries(), 1_000_000);
}

fn assert_same_behaviour(mut a: DedupWindow, mut b: DedupWindow, ids: &[&str], start: i64) {
    assert_eq!(a.len(), b.len());
    assert_eq!(a.window_ms(), b.window_ms());
    assert_eq!(a.max_entries(), b.max_entries());
    for (i, id) in ids.iter().cycle().take(ids.len() * 6).enumerate() {
        let now = start + (i as i64) * 7;
        assert_eq!(a.contains(id), b.contains(id), "{id} at {now}");
        assert_eq!(
            a.check_and_insert(id, now),
            b.check_and_insert(id, now),
            "{id} at {now}"
        );
        assert_eq!(a.len(), b.len());
    }
    assert_eq!(a.expire(start + 1_000_000), b.expire(start + 1_000_000));
}

#[test]
fn snapshot_round_trip_behaves_like_the_original() {
    let ids = ["a", U1, "b", U2, "c", "é-ünïcode", ""];
    let mut w = DedupWindow::new(40, 5);
    for (i, id) in ids.iter().enumerate() {
        w.check_and_insert(id, (i as i64) * 5);
    }
    w.forget("b");
    let bytes = w.snapshot();
    let restored = DedupWindow::restore(&bytes).unwrap();
    assert_eq!(restored.snapshot(), bytes);
    assert_eq!(restored.last_now, w.last_now);
    assert_same_behaviour(w.clone(), restored, &ids, 30);
    // Times before the latest one seen count as that time, in the original and the copy alike.
    assert_same_behaviour(w, DedupWindow::restore(&bytes).unwrap(), &ids, -100);
    let fresh = DedupWindow::new(40, 5);
    let restored = DedupWindow::restore(&fresh.snapshot()).unwrap();
    assert_eq!(restored.last_now, i64::MIN);
    assert!(restored.is_empty());
    assert_same_behaviour(fresh, restored, &ids, i64::MIN);
}

#[test]
fn snapshot_layout() {
    let mut w = DedupWindow::new(7, 3);
    w.check_and_insert("hi", 5);
    w.check_and_insert(U2, 6);
    let bytes = w.snapshot();
    let mut expected = Vec::new();
    expected.extend_from_slice(b"OSDEDUP\0");
    expected.extend_from_slice(&1u32.to_le_bytes());
    expected.extend_from_slice(&7u64.to_le_bytes());
    expected.extend_from_slice(&3u64.to_le_bytes());
    expected.extend_from_slice(&6i64.to_le_bytes());
    expected.extend_from_slice(&2u64.to_le_bytes());
    expected.push(1);
    expected.extend_from_slice(&5i64.to_le_bytes());
    expected.extend_from_slice(&2u32.to_le_bytes());
    expected.extend_from_slice(b"hi");
    expected.push(0);
    expected.extend_from_slice(&6i64.to_le_bytes());
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(bytes, expected);
    assert_eq!(bytes.len(), HEADER_LEN + MIN_ENTRY_LEN + 2 + 1 + 8 + 16);
}

fn valid_snapshot() -> Vec<u8> {
    let mut w = DedupWindow::new(100, 4);
    w.check_and_insert("first", 10);
    w.check_and_insert(U1, 20);
    w.check_and_insert("third", 30);
    w.snapshot()
}

fn err_offset(data: &[u8]) -> usize {
    DedupWindow::restore(data)
        .expect_err("must be refused")
        .offset
        .expect("an offset")
}

#[test]
fn restore_refuses_every_truncation_without_panicking() {
    let bytes = valid_snapshot();
    for len in 0..bytes.len() {
        let offset = err_offset(&bytes[..len]);
        assert!(offset <= len, "truncated to {len}: offset {offset}");
    }
}

#[test]
fn restore_refuses_any_single_byte_flip_or_behaves() {
    // No flipped byte may panic; most are refused.
    let bytes = valid_snapshot();
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut data = bytes.clone();
            data[i] ^= flip;
            if let Err(e) = DedupWindow::restore(&data) {
                assert!(e.offset.is_some_and(|o| o <= data.len()));
            }
        }
    }
}

#[test]
fn restore_refuses_bad_headers() {
    let bytes = valid_snapshot();
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(err_offset(&bad), 0);
    let mut bad = bytes.clone();
    bad[8] = 2; // version
    let e = DedupWindow::restore(&bad).unwrap_err();
    assert_eq!(e.offset, Some(8));
    assert!(e.message.contains("version 2"), "{}", e.message);
    let mut bad = bytes.clone();
    bad[12..20].copy_from_slice(&0u64.to_le_bytes()); // window_ms
    assert_eq!(err_offset(&bad), 12);
    let mut bad = bytes.clone();
    bad[20..28].copy_from_slice(&0u64.to_le_bytes()); // max_entries
    assert_eq!(err_offset(&bad), 20);
    let mut bad = bytes.clone();
    bad[20..28].copy_from_slice(&2u64.to_le_bytes()); // fewer than the 3 entries
    assert_eq!(err_offset(&bad), 36);
    let mut bad = bytes.clone();
    bad[36..44].copy_from_slice(&u64::MAX.to_le_bytes()); // count
    assert_eq!(err_offset(&bad), 36);
    let mut bad = bytes.clone();
    bad.push(0);
    let e = DedupWindow::restore(&bad).unwrap_err();
    assert_eq!(e.offset, Some(bytes.len()));
    assert!(e.message.contains("trailing"));
}

#[test]
fn restore_refuses_bad_entries() {
    let header = |count: u64, last_now: i64| {
        let mut h = Vec::new();
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&100u64.to_le_bytes());
        h.extend_from_slice(&10u64.to_le_bytes());
        h.extend_from_slice(&last_now.to_le_bytes());
        h.extend_from_slice(&count.to_le_bytes());
        h
    };
    let other = |ts: i64, id: &[u8]| {
        let mut e = vec![TAG_OTHER];
        e.extend_from_slice(&ts.to_le_bytes());
        e.extend_from_slice(&(id.len() as u32).to_le_bytes());
        e.extend_from_slice(id);
        e
    };
    let uuid = |ts: i64, k: u128| {
        let mut e = vec![TAG_UUID];
        e.extend_from_slice(&ts.to_le_bytes());
        e.extend_from_slice(&k.to_be_bytes());
        e
    };
    let h = HEADER_LEN;
    let cases: Vec<(Vec<u8>, usize, &str)> = vec![
        (
            [
                header(1, 50),
                vec![7],
                0i64.to_le_bytes().to_vec(),
                vec![0; 4],
            ]
            .concat(),
            h,
            "unknown entry tag",
        ),
        (
            [header(2, 50), other(40, b"a"), other(30, b"b")].concat(),
            h + 14 + 1,
            "not in order",
        ),
        (
            [header(1, 50), other(60, b"a")].concat(),
            h + 1,
            "after the latest",
        ),
        (
            [header(1, 500), other(400, b"a")].concat(),
            h + 1,
            "outside the window",
        ),
        (
            [header(2, 50), other(40, b"a"), other(40, b"a")].concat(),
            h + 14,
            "duplicate",
        ),
        (
            [header(2, 50), uuid(40, 9), uuid(40, 9)].concat(),
            h + 25,
            "duplicate",
        ),
        (
            [header(1, 50), other(40, b"a\xffb")].concat(),
            h + 13 + 1,
            "UTF-8",
        ),
        (
            [header(1, 50), other(40, U1.as_bytes())].concat(),
            h + 13,
            "UUID",
        ),
        (
            [header(1, 50), other(40, b"abc")[..14].to_vec()].concat(),
            h + 14,
            "truncated",
        ),
    ];
    for (data, offset, message) in cases {
        let e = DedupWindow::restore(&data).unwrap_err();
        assert_eq!(e.offset, Some(offset), "{message}: {e}");
        assert!(e.message.contains(message), "expected {message:?} in {e}");
    }
    // A length that claims more than is there.
    let mut data = [header(1, 50), other(40, b"abc")].concat();
    data[h + 9..h + 13].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(DedupWindow::restore(&data)
        .unwrap_err()
        .message
        .contains("truncated"));
}

#[test]
fn restored_window_continues_exactly() {
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    let mut a = DedupWindow::new(50, 20);
    let mut now = 0i64;
    for step in 0..5_000 {
        now += (next() % 5) as i64 - 1; // sometimes backwards
        let id = format!("id-{}", next() % 40);
        let r = next() % 10;
        if r == 0 {
            a.forget(&id);
        } else {
            a.check_and_insert(&id, now);
        }
        if step % 97 == 0 {
            let b = DedupWindow::restore(&a.snapshot()).unwrap();
            let ids: Vec<String> = (0..40).map(|i| format!("id-{i}")).collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            assert_same_behaviour(a.clone(), b, &ids, now);
        }
    }
}

/// A plain reference: a list of `(ts, id)` oldest first, ids normalized as the window keys them.
struct Model {
    window_ms: u64,
    max_entries: usize,
    last_now: i64,
    entries: VecDeque<(i64, String)>,
}

impl Model {
    fn norm(id: &str) -> String {
        if uuid_key(id).is_some() {
            id.to_ascii_lowercase()
        } else {
            id.to_owned()
        }
    }

    fn check_and_insert(&mut self, id: &str, now_ms: i64) -> bool {
        self.last_now = self.last_now.max(now_ms);
        let now = self.last_now;
        let window = self.window_ms;
        self.entries.retain(|(ts, _)| !expired(*ts, now, window));
        let id = Self::norm(id);
        if self.entries.iter().any(|(_, e)| *e == id) {
            return false;
        }
        self.entries.push_back((now, id));
        while self.entries.len() > self.max_entries {
            self.entries.pop_front();
        }
        true
    }

    fn forget(&mut self, id: &str) -> bool {
        let id = Self::norm(id);
        let before = self.entries.len();
        self.entries.retain(|(_, e)| *e != id);
        before != self.entries.len()
    }

    fn contains(&self, id: &str) -> bool {
        let id = Self::norm(id);
        self.entries
            .iter()
            .any(|(ts, e)| *e == id && !expired(*ts, self.last_now, self.window_ms))
    }
}

#[test]
fn exact_under_hash_collisions() {
    // Two hash bits: every id shares its hash with a quarter of the others,
    // so each answer rests on the exact comparison.
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    for (mask, head) in [
        (0u64, 0u32),
        (0x3, u32::MAX - 300),
        (u64::MAX, u32::MAX - 7),
    ] {
        let mut w = DedupWindow::new(60, 25);
        w.hasher.mask = mask;
        // Sequence numbers wrap around u32::MAX within the run.
        w.head_seq = head;
        let mut m = Model {
            window_ms: 60,
            max_entries: 25,
            last_now: i64::MIN,
            entries: VecDeque::new(),
        };
        let mut now = 0i64;
        for step in 0..20_000 {
            now += (next() % 4) as i64 - 1;
            let n = next() % 50;
            let id = match next() % 3 {
                0 => format!("id-{n}"),
                1 => format!("{n:08x}-0000-4000-8000-00000000000a"),
                _ => format!("{n:08X}-0000-4000-8000-00000000000A"),
            };
            match next() % 10 {
                0 => assert_eq!(w.forget(&id), m.forget(&id), "forget {id} at {step}"),
                1 => assert_eq!(w.contains(&id), m.contains(&id), "contains {id} at {step}"),
                _ => assert_eq!(
                    w.check_and_insert(&id, now),
                    m.check_and_insert(&id, now),
                    "check {id} at {step}"
                ),
            }
            assert_eq!(w.len(), m.entries.len(), "len at {step}");
            if step % 1000 == 0 {
                // A restored window hashes every id again, with its own seed.
                let r = DedupWindow::restore(&w.snapshot()).unwrap();
                assert_eq!(r.snapshot(), w.snapshot());
            }
        }
    }
}

/// Making room (as the ingestor does before a batch) rebuilds the table
/// from the ring: the answers stay those of the reference, under forced
/// hash collisions, forgotten ids and sequence numbers that wrap, and the
/// table never grows past twice `max_entries`.
#[test]
fn reserving_room_changes_no_answer() {
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    for (mask, head) in [(0x7u64, u32::MAX - 500), (u64::MAX, 0)] {
        let (window_ms, max_entries) = (200, 300);
        let mut w = DedupWindow::new(window_ms, max_entries);
        w.hasher.mask = mask;
        w.head_seq = head;
        let mut m = Model {
            window_ms,
            max_entries,
            last_now: i64::MIN,
            entries: VecDeque::new(),
        };
        let (mut now, mut grown) = (0i64, 0);
        for step in 0..30_000 {
            now += (next() % 3) as i64 - 1;
            let id = format!("id-{}", next() % 700);
            match next() % 50 {
                0 => {
                    let before = w.table.capacity();
                    w.reserve((next() % 400) as usize);
                    grown += usize::from(w.table.capacity() > before);
                    assert!(w.table.capacity() < 4 * max_entries, "step {step}");
                }
                1..=4 => assert_eq!(w.forget(&id), m.forget(&id), "forget {id} at {step}"),
                5..=9 => {
                    assert_eq!(w.contains(&id), m.contains(&id), "contains {id} at {step}");
                }
                _ => assert_eq!(
                    w.check_and_insert(&id, now),
                    m.check_and_insert(&id, now),
                    "check {id} at {step}"
                ),
            }
            assert_eq!(w.len(), m.entries.len(), "len at {step}");
            if step % 5_000 == 4_999 {
                // Empty again, so the table grows anew.
                w.clear();
                m.entries.clear();
            }
        }
        assert!(grown >= 4, "the table grew {grown} times");
        for i in 0..700 {
            let id = format!("id-{i}");
            assert_eq!(w.contains(&id), m.contains(&id), "contains {id} at the end");
        }
    }
}

#[test]
fn a_full_window_keeps_its_table_size() {
    let mut w = DedupWindow::new(u64::MAX, 1000);
    for i in 0..2000 {
        assert!(w.check_and_insert(format!("{i:08x}-0000-4000-8000-000000000000"), 0));
    }
    let sized = w.table_capacity;
    assert!((2000..4096).contains(&sized), "{sized}");
    for i in 0..100_000 {
        assert!(w.check_and_insert(format!("x-{i}"), 0));
    }
    assert_eq!(w.len(), 1000);
    assert_eq!(w.table_capacity, sized);
}

#[test]
fn check_and_insert_keys_is_check_and_insert_in_order() {
    let ids = ["a", "b", "a", U1, &U1.to_uppercase(), "c", "b"];
    let mut one = DedupWindow::new(100, 3);
    let mut many = one.clone();
    let expected: Vec<bool> = ids.iter().map(|id| one.check_and_insert(id, 5)).collect();
    let mut out = Vec::new();
    many.check_and_insert_keys(ids.iter().map(|id| IdKey::of(id.as_bytes())), 5, &mut out);
    assert_eq!(out, expected);
    assert_eq!(many.snapshot(), one.snapshot());
}
