//! NDJSON (or a list of byte strings) to the priority queue in one call:
//! split, decode and validate every line, de-duplicate by id, enqueue.
//!
//! Every valid line is ingested even when other lines are invalid, and nothing
//! is lost silently: each line ends up accepted, a duplicate, invalid (with its
//! error), refused by the queue (and then not recorded as seen), or queued and
//! later shed by the queue's overflow policy (and then handed back).
//!
//! The work is split into phases so a host can run the phases that touch
//! shared state under their own locks and build its objects outside them; see
//! [`ingest`] for the whole pipeline in plain Rust.

use std::borrow::Cow;

use foldhash::HashSet;
use hashbrown::hash_table::{Entry, HashTable};

use crate::dedup::{DedupWindow, IdKey, KeyHasher, OwnedIdKey};
use crate::envelope::{self, EnvelopeIndex};
use crate::json::{JsonError, Limits};
use crate::queue::PriorityQueue;

/// The lines of an NDJSON buffer: split on `\n`, one trailing `\r` removed,
/// and no line for the empty piece after a final newline.
pub fn split_lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut rest = (!data.is_empty()).then_some(body);
    std::iter::from_fn(move || {
        let chunk = rest?;
        let line = if let Some(i) = memchr::memchr(b'\n', chunk) {
            rest = Some(&chunk[i + 1..]);
            &chunk[..i]
        } else {
            rest = None;
            chunk
        };
        Some(line.strip_suffix(b"\r").unwrap_or(line))
    })
}

/// One line after decoding.
pub struct Decoded<'a> {
    pub index: usize,
    pub bytes: &'a [u8],
    pub envelope: EnvelopeIndex,
}

impl<'a> Decoded<'a> {
    /// The event's id as bytes (borrowed unless it was escaped on the wire).
    #[must_use]
    pub fn id(&self) -> std::borrow::Cow<'a, [u8]> {
        self.envelope.id.as_bytes(self.bytes)
    }
}

/// How many lines a host should take through the phases at a time: large
/// enough to pay for a lock once per batch, small enough to stay in cache.
pub const CHUNK_LINES: usize = 256;

/// Phase 1: decode every line, numbering them from `first_index`; invalid
/// lines go to `invalid` as (index, message).
pub fn decode_lines<'a>(
    lines: impl IntoIterator<Item = &'a [u8]>,
    first_index: usize,
    limits: &Limits,
    invalid: &mut Vec<(usize, String)>,
) -> Vec<Decoded<'a>> {
    let lines = lines.into_iter();
    let mut out = Vec::with_capacity(lines.size_hint().0);
    for (n, bytes) in lines.enumerate() {
        decode_line(bytes, first_index + n, limits, &mut out, invalid);
    }
    out
}

/// Decode line `index` onto `out`, or its error onto `invalid`.
#[inline]
fn decode_line<'a>(
    bytes: &'a [u8],
    index: usize,
    limits: &Limits,
    out: &mut Vec<Decoded<'a>>,
    invalid: &mut Vec<(usize, String)>,
) {
    let result = if bytes.iter().all(u8::is_ascii_whitespace) {
        Err(JsonError::at(0, "empty line"))
    } else {
        envelope::decode(bytes, limits)
    };
    match result {
        Ok(envelope) => out.push(Decoded {
            index,
            bytes,
            envelope,
        }),
        Err(e) => invalid.push((index, e.to_string())),
    }
}

/// NDJSON split and decoded in one pass, some lines at a time: the lines of
/// [`split_lines`], each decoded as [`decode_lines`] decodes it.
///
/// A line holding a compact envelope (see [`envelope::decode_line_prefix`])
/// is decoded from where it starts, and ends where the envelope does; any
/// other line is found by searching for its newline, then decoded.
pub struct NdjsonLines<'a> {
    /// The input without its final newline.
    body: &'a [u8],
    /// Where the next line starts in `body`; `None` when no line is left.
    next: Option<usize>,
    /// The next line's number.
    index: usize,
}

impl<'a> NdjsonLines<'a> {
    #[must_use]
    pub fn new(data: &'a [u8]) -> Self {
        NdjsonLines {
            body: data.strip_suffix(b"\n").unwrap_or(data),
            next: (!data.is_empty()).then_some(0),
            index: 0,
        }
    }

    /// How many lines have been read.
    #[must_use]
    pub fn lines_read(&self) -> usize {
        self.index
    }

    /// How many bytes have been read, and how many are left.
    #[must_use]
    pub fn bytes(&self) -> (usize, usize) {
        let read = self.next.unwrap_or(self.body.len());
        (read, self.body.len() - read)
    }

    /// Read up to `max` more lines: the valid ones onto `out`, the errors of
    /// the others onto `invalid`. Returns how many lines were read (0 once
    /// none is left).
    pub fn read(
        &mut self,
        max: usize,
        limits: &Limits,
        out: &mut Vec<Decoded<'a>>,
        invalid: &mut Vec<(usize, String)>,
    ) -> usize {
        let body = self.body;
        let mut n = 0;
        while n < max {
            let Some(start) = self.next else { break };
            let rest = &body[start..];
            let index = self.index;
            self.index += 1;
            n += 1;
            if let Some((envelope, end)) = envelope::decode_line_prefix(rest, limits) {
                // The envelope is the line when the line ends right after it.
                let next = match &rest[end..] {
                    [] | [b'\r'] => Some(None),
                    [b'\n', ..] => Some(Some(start + end + 1)),
                    [b'\r', b'\n', ..] => Some(Some(start + end + 2)),
                    _ => None,
                };
                if let Some(next) = next {
                    self.next = next;
                    out.push(Decoded {
                        index,
                        bytes: &rest[..end],
                        envelope,
                    });
                    continue;
                }
            }
            let line = if let Some(i) = memchr::memchr(b'\n', rest) {
                self.next = Some(start + i + 1);
                &rest[..i]
            } else {
                self.next = None;
                rest
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            decode_line(line, index, limits, out, invalid);
        }
        n
    }
}

/// The valid lines of a batch, sorted by the dedup window: indexes into the
/// decoded lines, which stay where they are.
struct Screened {
    /// Lines whose id is new to the window and first in the batch, in order.
    fresh: Vec<usize>,
    /// Lines whose id the window holds (`None`), or that repeat the id of the
    /// line `fresh[i]` (`Some(i)`).
    repeats: Vec<(usize, Option<usize>)>,
}

impl Screened {
    /// Every line fresh: what no dedup window makes of a batch.
    #[must_use]
    fn all(lines: usize) -> Self {
        Screened {
            fresh: (0..lines).collect(),
            repeats: Vec::new(),
        }
    }
}

/// A chunk's ids parsed and hashed for one window, and each line's first
/// sighting within the chunk: the part of screening that reads nothing of the
/// window's state, so threads sharing a window do it before taking its lock.
pub struct ChunkKeys<'a> {
    /// Each line's id (borrowed from its line unless it was escaped on the wire).
    ids: Vec<Cow<'a, [u8]>>,
    /// Each line's UUID value (`None`: the id is held whole) and the window's hash of its key.
    keys: Vec<(Option<u128>, u64)>,
    /// For each line, the earlier line of the chunk with the same id, if any.
    first: Vec<Option<u32>>,
}

impl<'a> ChunkKeys<'a> {
    /// The keys of `decoded`'s ids hashed with `hasher`, which must be the
    /// [`DedupWindow::key_hasher`] of the window they are then admitted to.
    #[must_use]
    pub fn new(decoded: &[Decoded<'a>], hasher: &KeyHasher) -> Self {
        let ids: Vec<Cow<'a, [u8]>> = decoded.iter().map(Decoded::id).collect();
        let keys: Vec<(Option<u128>, u64)> = ids
            .iter()
            .map(|id| {
                let key = IdKey::of(id);
                let uuid = match key {
                    IdKey::Uuid(value) => Some(value),
                    IdKey::Other(_) => None,
                };
                (uuid, hasher.hash(key))
            })
            .collect();
        let key = |line: usize| match keys[line].0 {
            Some(value) => IdKey::Uuid(value),
            None => IdKey::Other(&ids[line]),
        };
        // The chunk's own first sightings, filed under the window's hashes.
        let mut first_of: HashTable<u32> = HashTable::with_capacity(keys.len());
        let first = (0..keys.len())
            .map(|line| {
                let (this, hash) = (key(line), keys[line].1);
                match first_of.entry(hash, |&i| key(i as usize) == this, |&i| keys[i as usize].1) {
                    Entry::Occupied(earlier) => Some(*earlier.get()),
                    Entry::Vacant(slot) => {
                        slot.insert(line as u32);
                        None
                    }
                }
            })
            .collect();
        ChunkKeys { ids, keys, first }
    }

    /// The lines' count.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the chunk has no lines.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Line `line`'s key and hash.
    #[inline]
    fn key(&self, line: usize) -> (IdKey<'_>, u64) {
        let (uuid, hash) = self.keys[line];
        let key = match uuid {
            Some(value) => IdKey::Uuid(value),
            None => IdKey::Other(&self.ids[line]),
        };
        (key, hash)
    }
}

/// Phase 2: screen the lines against the window (expired to `now_ms` first),
/// recording nothing yet; a line that repeats an earlier one of the chunk
/// takes that line's answer without a look at the window.
///
/// Nothing is recorded until the queue has taken the lines (phase 4,
/// [`record`]): a line the queue refuses must leave the window as it was,
/// without an id of its own and without having evicted an older one.
fn screen(keys: &ChunkKeys<'_>, window: &mut DedupWindow, now_ms: i64) -> Screened {
    window.expire(now_ms);
    let lines = keys.len();
    let mut screened = Screened {
        fresh: Vec::with_capacity(lines),
        repeats: Vec::new(),
    };
    // Each first sighting's place in `fresh`, when it is fresh.
    let mut fresh_at: Vec<Option<usize>> = vec![None; lines];
    for (line, first) in keys.first.iter().enumerate() {
        let (key, hash) = keys.key(line);
        if let Some(first) = *first {
            screened.repeats.push((line, fresh_at[first as usize]));
        } else if window.contains_hashed(key, hash) {
            screened.repeats.push((line, None));
        } else {
            fresh_at[line] = Some(screened.fresh.len());
            screened.fresh.push(line);
        }
    }
    screened
}

/// Phase 4: record the ids of the fresh lines the queue kept: not those it
/// refused (`refused` holds their positions in `fresh`, in order), nor those
/// whose id is in `dropped` (shed by the queue in the same call).
fn record(
    keys: &ChunkKeys<'_>,
    fresh: &[usize],
    refused: &[usize],
    dropped: &HashSet<OwnedIdKey>,
    window: &mut DedupWindow,
    now_ms: i64,
) {
    let mut refused = refused.iter().peekable();
    for (i, &line) in fresh.iter().enumerate() {
        if refused.next_if_eq(&&i).is_some() {
            continue;
        }
        let (key, hash) = keys.key(line);
        if dropped.is_empty() || !dropped.contains(&OwnedIdKey::from(key)) {
            // Screened absent under the same hold of the window, and the
            // fresh lines' keys are distinct.
            window.insert_absent_hashed(key, hash, now_ms);
        }
    }
}

/// Phase 5: the line indexes refused by the queue, in order: the fresh lines
/// it refused, and the repeats of those in the same batch, which were repeats
/// of a line that never got in (they leave `screened.repeats`).
fn refused_lines(
    decoded: &[Decoded<'_>],
    screened: &mut Screened,
    refused: &[usize],
) -> Vec<usize> {
    let mut lines: Vec<usize> = refused
        .iter()
        .map(|&i| decoded[screened.fresh[i]].index)
        .collect();
    if refused.is_empty() {
        return lines;
    }
    screened.repeats.retain(|&(line, of)| {
        let repeat_of_refused = of.is_some_and(|i| refused.binary_search(&i).is_ok());
        if repeat_of_refused {
            lines.push(decoded[line].index);
        }
        !repeat_of_refused
    });
    lines.sort_unstable();
    lines
}

/// What [`admit`] did with one batch of decoded lines.
#[derive(Debug)]
pub struct Admitted<T> {
    /// Lines whose item went into the queue (under the shed policy it may
    /// have been dropped again: then it is in `shed`).
    pub accepted: usize,
    pub duplicates: usize,
    /// Line indexes of valid, new events that the queue refused (full or closed).
    pub rejected: Vec<usize>,
    /// Items the queue dropped under its shed policy.
    pub shed: Vec<T>,
    /// The items of the rejected lines, for the caller to drop (after any lock).
    pub refused: Vec<T>,
}

/// Phases 2 to 5 for lines whose items are built: screen against the window,
/// enqueue the fresh lines' items, record the ids of what the queue kept, and
/// forget the ids of what it shed (a shed event was never processed, so a
/// redelivery must get in).
///
/// Run it with the window held for the whole call (the Python bindings hold
/// its lock): two ingestors sharing a window then cannot both take an id.
/// `items[i]` is the item for `decoded[i]`; the fresh lines' items are taken
/// out, the rest stay for the caller to drop. `id_of` reads an item's id, for
/// the shed ones. No caller code runs under the queue's lock.
pub fn admit<T>(
    decoded: &[Decoded<'_>],
    items: &mut [Option<T>],
    window: Option<&mut DedupWindow>,
    now_ms: i64,
    queue: &PriorityQueue<T>,
    id_of: impl Fn(&T) -> Option<Vec<u8>>,
) -> Admitted<T> {
    match window {
        Some(w) => {
            let keys = ChunkKeys::new(decoded, &w.key_hasher());
            admit_keyed(decoded, items, Some((w, &keys)), now_ms, queue, id_of)
        }
        None => admit_keyed(decoded, items, None, now_ms, queue, id_of),
    }
}

/// [`admit`] with the chunk's keys made beforehand ([`ChunkKeys::new`], with
/// the window's [`DedupWindow::key_hasher`]), so that a caller holding the
/// window under a lock holds it only to look the keys up and record them.
pub fn admit_keyed<T>(
    decoded: &[Decoded<'_>],
    items: &mut [Option<T>],
    window: Option<(&mut DedupWindow, &ChunkKeys<'_>)>,
    now_ms: i64,
    queue: &PriorityQueue<T>,
    id_of: impl Fn(&T) -> Option<Vec<u8>>,
) -> Admitted<T> {
    let (mut screened, window) = match window {
        Some((w, keys)) => {
            assert_eq!(keys.len(), decoded.len(), "one key a line");
            (screen(keys, w, now_ms), Some((w, keys)))
        }
        None => (Screened::all(decoded.len()), None),
    };
    let batch: Vec<(T, u8)> = screened
        .fresh
        .iter()
        .filter_map(|&line| Some((items[line].take()?, decoded[line].envelope.priority)))
        .collect();
    let mut refused = Vec::new();
    let mut refused_items = Vec::new();
    let shed = queue.push_each(batch, |i, err| {
        refused.push(i);
        refused_items.push(err.into_inner());
    });
    if let Some((w, keys)) = window {
        let dropped: Vec<Vec<u8>> = shed.iter().filter_map(&id_of).collect();
        let dropped_keys: HashSet<OwnedIdKey> =
            dropped.iter().map(|id| IdKey::of(id).into()).collect();
        record(keys, &screened.fresh, &refused, &dropped_keys, w, now_ms);
        for id in &dropped {
            w.forget(id);
        }
    }
    let rejected = refused_lines(decoded, &mut screened, &refused);
    Admitted {
        accepted: screened.fresh.len() - refused.len(),
        duplicates: screened.repeats.len(),
        rejected,
        shed,
        refused: refused_items,
    }
}

/// What [`ingest`] did.
#[derive(Debug)]
pub struct Report<T> {
    pub accepted: usize,
    pub duplicates: usize,
    pub invalid: Vec<(usize, String)>,
    /// Line indexes of valid, new events that the queue refused (full or closed).
    pub rejected: Vec<usize>,
    /// Items the queue dropped under its shed policy.
    pub shed: Vec<T>,
}

/// The whole pipeline in plain Rust: decode, build each item with `make`,
/// then [`admit`] the batch.
pub fn ingest<'a, T>(
    lines: impl IntoIterator<Item = &'a [u8]>,
    limits: &Limits,
    window: Option<&mut DedupWindow>,
    now_ms: i64,
    queue: &PriorityQueue<T>,
    mut make: impl FnMut(&Decoded<'a>) -> T,
    id_of: impl Fn(&T) -> Option<Vec<u8>>,
) -> Report<T> {
    let mut invalid = Vec::new();
    let decoded = decode_lines(lines, 0, limits, &mut invalid);
    let mut window = window;
    if let Some(w) = window.as_deref_mut() {
        w.reserve(decoded.len());
    }
    let mut items: Vec<Option<T>> = decoded.iter().map(|d| Some(make(d))).collect();
    let admitted = admit(&decoded, &mut items, window, now_ms, queue, id_of);
    Report {
        accepted: admitted.accepted,
        duplicates: admitted.duplicates,
        invalid,
        rejected: admitted.rejected,
        shed: admitted.shed,
    }
}

#[cfg(test)]
mod tests {
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
}
