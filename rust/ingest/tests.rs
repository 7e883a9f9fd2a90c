//! Unit tests of NDJSON ingestion.

use super::*;
use crate::queue::Overflow;

#[test]
fn shed_events_are_not_remembered() {
    // Capacity 1, shed: the low-priority line is shed on arrival, the
    // other stays; the window holds only what stayed.
    let queue = PriorityQueue::new(Some(1), Overflow::Shed, None);
    let mut window = DedupWindow::new(60_000, 100);
    let data = [line("mid", 3), line("low", 5)].join("\n");
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!(report.shed, vec!["low".to_owned()]);
    assert!(window.contains("mid") && !window.contains("low"));
    // A higher-priority line then sheds "mid", queued by the earlier call:
    // its id is forgotten, so a redelivery gets in.
    let data = line("top", 0);
    let report = run(&data, &queue, &mut window, 1);
    assert_eq!(report.shed, vec!["mid".to_owned()]);
    assert!(window.contains("top") && !window.contains("mid"));
}

/// Ingest NDJSON `data` with each event's id as its item.
fn run(
    data: &str,
    queue: &PriorityQueue<String>,
    window: &mut DedupWindow,
    now_ms: i64,
) -> Report<String> {
    let make = |d: &Decoded<'_>| d.envelope.id.as_str(d.bytes).into_owned();
    let id_of = |item: &String| Some(item.clone().into_bytes());
    ingest(
        split_lines(data.as_bytes()),
        &Limits::default(),
        Some(window),
        now_ms,
        queue,
        make,
        id_of,
    )
}

fn line(id: &str, priority: u8) -> String {
    format!(
        r#"{{"id":"{id}","timestamp":1,"traceId":"t","source":"s","sessionId":"x","priority":{priority},"type":"INPUT:SIGNAL","payload":null}}"#
    )
}

/// Two threads ingest at once, a chunk at a time, sharing one window (held
/// for each chunk's admission) and one queue: every id gets in once,
/// wherever it was sent from, and each thread's lines keep their order
/// within a priority.
#[test]
fn two_threads_sharing_a_window_take_each_id_once() {
    two_threads_share_a_window(false);
}

/// The same with each chunk's keys made before the window's lock is taken,
/// as the Python bindings make them; the ids both threads send are UUIDs,
/// in lower case from one thread and upper case from the other.
#[test]
fn two_threads_keying_outside_the_lock_take_each_id_once() {
    two_threads_share_a_window(true);
}

fn two_threads_share_a_window(keyed: bool) {
    let queue = PriorityQueue::new(None, Overflow::Reject, None);
    let window = parking_lot::Mutex::new(DedupWindow::new(60_000, 100_000));
    let blob = |tag: &str| -> String {
        (0..2_000)
            .map(|i| {
                // A quarter of the ids are sent by both threads.
                let id = if i % 4 == 0 {
                    let first = if tag == "a" { "0000000a" } else { "0000000A" };
                    format!("{first}-0000-4000-8000-{i:012}")
                } else {
                    format!("{tag}-{i}")
                };
                line(&id, (i % 6) as u8)
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let blobs = [blob("a"), blob("b")];
    let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let workers: Vec<_> = blobs
            .iter()
            .map(|data| {
                let (queue, window) = (&queue, &window);
                scope.spawn(move || {
                    let lines: Vec<&[u8]> = split_lines(data.as_bytes()).collect();
                    let (mut accepted, mut duplicates) = (0, 0);
                    for (n, chunk) in lines.chunks(CHUNK_LINES).enumerate() {
                        let mut invalid = Vec::new();
                        let decoded = decode_lines(
                            chunk.iter().copied(),
                            n * CHUNK_LINES,
                            &Limits::default(),
                            &mut invalid,
                        );
                        assert!(invalid.is_empty());
                        let mut items: Vec<Option<String>> = decoded
                            .iter()
                            .map(|d| Some(d.envelope.id.as_str(d.bytes).into_owned()))
                            .collect();
                        let id_of = |id: &String| Some(id.clone().into_bytes());
                        let admitted = if keyed {
                            let hasher = window.lock().key_hasher();
                            let keys = ChunkKeys::new(&decoded, &hasher);
                            admit_keyed(
                                &decoded,
                                &mut items,
                                Some((&mut window.lock(), &keys)),
                                0,
                                queue,
                                id_of,
                            )
                        } else {
                            admit(
                                &decoded,
                                &mut items,
                                Some(&mut window.lock()),
                                0,
                                queue,
                                id_of,
                            )
                        };
                        accepted += admitted.accepted;
                        duplicates += admitted.duplicates;
                    }
                    (accepted, duplicates)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    // 1,500 own ids a thread, 500 sent by both.
    assert_eq!(counts.iter().map(|c| c.0).sum::<usize>(), 3_500);
    assert_eq!(counts.iter().map(|c| c.1).sum::<usize>(), 500);
    let popped: Vec<String> = std::iter::from_fn(|| queue.try_pop()).collect();
    let mut unique = popped.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3_500);
    let number = |id: &str| -> usize { id.rsplit('-').next().unwrap().parse().unwrap() };
    let priorities: Vec<usize> = popped.iter().map(|id| number(id) % 6).collect();
    assert!(priorities.windows(2).all(|w| w[0] <= w[1]));
    for tag in ["a-", "b-"] {
        let own: Vec<usize> = popped
            .iter()
            .filter(|id| id.starts_with(tag))
            .map(|id| number(id))
            .collect();
        let mut expected = own.clone();
        expected.sort_by_key(|&i| (i % 6, i));
        assert_eq!(own, expected);
    }
}

/// Splitting and decoding in one pass reads what splitting then
/// decoding reads, line for line, error for error, whatever the lines
/// and their endings, a chunk at a time.
#[test]
fn one_pass_reading_agrees_with_splitting_then_decoding() {
    // The one pass takes the lines below as they start (no search for
    // their end); the lines that it leaves are split first.
    let two = format!("{}\n{}", line("a", 1), line("b", 2));
    let first = envelope::decode_line_prefix(two.as_bytes(), &Limits::default());
    assert_eq!(first.map(|(_, end)| end), Some(line("a", 1).len()));
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let alphabet = b"{}[]:,\"\\ \r\n\n\n0123456789-.etrufalsn\x00\xc3\xa9";
    let payloads = [
        r#"{"a":[1,2.5,{"b":null}],"c":"d"}"#,
        "[\n]",
        "{ \"x\" :\r\ttrue }",
    ];
    let small = Limits {
        max_bytes: 220,
        max_depth: 3,
    };
    for round in 0..3_000 {
        let mut data = Vec::new();
        for k in 0..(next() % 5) {
            let mut l = line(&format!("id-{round}-{k}"), (next() % 6) as u8).into_bytes();
            if next() % 2 == 0 {
                let p = payloads[(next() % 3) as usize];
                let text = String::from_utf8(l).unwrap().replace("null", p);
                l = text.into_bytes();
            }
            if next() % 3 == 0 {
                l.truncate(l.len() - 1);
                l.extend_from_slice(br#","parentId":"p"}"#);
            }
            data.extend_from_slice(&l);
            data.extend_from_slice(
                [&b"\n"[..], b"\r\n", b"\r", b" \n", b"\n\n"][(next() % 5) as usize],
            );
        }
        for _ in 0..(next() % 4) {
            if data.is_empty() {
                break;
            }
            let at = (next() as usize) % data.len();
            data[at] = alphabet[(next() as usize) % alphabet.len()];
        }
        if next() % 4 == 0 {
            data.pop();
        }
        for limits in [Limits::default(), small] {
            let mut want_invalid = Vec::new();
            let want = decode_lines(split_lines(&data), 0, &limits, &mut want_invalid);
            let mut reader = NdjsonLines::new(&data);
            let (mut got, mut got_invalid) = (Vec::new(), Vec::new());
            let chunk = 1 + (next() % 3) as usize;
            while reader.read(chunk, &limits, &mut got, &mut got_invalid) > 0 {}
            assert_eq!(reader.lines_read(), split_lines(&data).count());
            assert_eq!(reader.bytes().1, 0);
            assert_eq!(
                got_invalid,
                want_invalid,
                "{}",
                String::from_utf8_lossy(&data)
            );
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    (g.index, g.bytes, &g.envelope),
                    (w.index, w.bytes, &w.envelope)
                );
                assert_eq!(g.bytes.as_ptr(), w.bytes.as_ptr());
            }
        }
    }
}

#[test]
fn splits_lines_like_ndjson() {
    let lines: Vec<&[u8]> = split_lines(b"a\r\nb\n\nc\n").collect();
    assert_eq!(lines, vec![&b"a"[..], b"b", b"", b"c"]);
    assert_eq!(split_lines(b"").count(), 0);
    assert_eq!(split_lines(b"\n").collect::<Vec<_>>(), vec![&b""[..]]);
    assert_eq!(split_lines(b"x").count(), 1);
}

#[test]
fn ingests_valid_lines_and_reports_the_rest() {
    let data = [
        line("a", 3),
        "{bad".into(),
        line("b", 0),
        line("a", 3),
        String::new(),
        line("c", 5),
    ]
    .join("\n");
    let queue = PriorityQueue::new(None, Overflow::Reject, None);
    let mut window = DedupWindow::new(60_000, 100);
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!(report.accepted, 3);
    assert_eq!(report.duplicates, 1);
    assert_eq!(
        report.invalid.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![1, 4]
    );
    assert!(report.invalid[1].1.contains("empty line"));
    let order: Vec<String> = std::iter::from_fn(|| queue.try_pop()).collect();
    assert_eq!(order, vec!["b", "a", "c"]);
}

#[test]
fn refused_events_are_not_remembered() {
    let data = [line("a", 1), line("b", 1), line("c", 1)].join("\n");
    let queue = PriorityQueue::new(Some(2), Overflow::Reject, None);
    let mut window = DedupWindow::new(60_000, 100);
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!((report.accepted, report.rejected.clone()), (2, vec![2]));
    assert_eq!(queue.try_pop().as_deref(), Some("a"));
    let report = run(&data, &queue, &mut window, 1);
    assert_eq!((report.accepted, report.duplicates), (1, 2));
}

#[test]
fn a_refused_line_does_not_evict_from_a_full_window() {
    let queue = PriorityQueue::new(Some(2), Overflow::Reject, None);
    let mut window = DedupWindow::new(60_000, 2);
    let data = [line("a", 1), line("b", 1), line("c", 1)].join("\n");
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!((report.accepted, report.rejected.clone()), (2, vec![2]));
    assert!(window.contains("a") && window.contains("b") && !window.contains("c"));
    while queue.try_pop().is_some() {}
    let again = line("a", 1);
    let report = run(&again, &queue, &mut window, 1);
    assert_eq!((report.accepted, report.duplicates), (0, 1));
}

#[test]
fn uuid_repeats_in_another_case_follow_the_refused_line() {
    let u = "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f";
    let data = [line("x", 1), line(&u.to_uppercase(), 1), line(u, 1)].join("\n");
    let queue = PriorityQueue::new(Some(1), Overflow::Reject, None);
    let mut window = DedupWindow::new(60_000, 100);
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!(
        (report.accepted, report.duplicates, report.rejected.clone()),
        (1, 0, vec![1, 2])
    );
}

#[test]
fn repeats_of_a_refused_line_are_refused_too() {
    let data = [line("a", 1), line("b", 1), line("b", 1), line("a", 1)].join("\n");
    let queue = PriorityQueue::new(Some(1), Overflow::Reject, None);
    let mut window = DedupWindow::new(60_000, 100);
    let report = run(&data, &queue, &mut window, 0);
    assert_eq!(
        (report.accepted, report.duplicates, report.rejected.clone()),
        (1, 1, vec![1, 2])
    );
    assert!(!window.contains("b"));
    assert!(window.contains("a"));
}
