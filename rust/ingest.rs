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
mod tests;
