//! Exact sliding-window de-duplication of event ids.
//!
//! An id is a duplicate when it was first seen less than `window_ms` ago and is
//! among the last `max_entries` ids recorded. The window is exact: canonical
//! UUIDs are held as 128-bit integers (so case does not matter), every other id
//! is held whole, and a hash only ever narrows the search: each candidate is
//! confirmed by comparing the id itself, so there are no false positives and a
//! hash collision costs one comparison.
//!
//! # Time
//!
//! Every call that takes a time uses `now = max(now_ms, last_now)`: time that
//! goes backwards counts as no time passing. Before an id is checked, the
//! entries with `ts <= now - window_ms` are dropped, so an id first seen at `t`
//! is a duplicate for every `now` in `[t, t + window_ms)`. A duplicate does not
//! refresh its entry's time.
//!
//! # Cost
//!
//! Each id is held once, in a time-ordered ring of `(hash, ts, key)` that also
//! drives expiry and the count bound. A hash table holds only each live
//! entry's sequence number (its place in the ring), 4 bytes a bucket: at
//! 100,000 ids the table is about 0.6 MiB and stays in a core's L2 cache,
//! where a table of keys would be 4 MiB and miss it on most probes. Evicting the oldest entry finds its
//! bucket by the stored hash and sequence number, without reading the key.
//! Each operation is amortized O(1). [`DedupWindow::forget`] marks its ring
//! entry dead (or pops it when it is the newest); the ring is compacted, and
//! the table renumbered, when dead entries outnumber live ones.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::mem::size_of;

use hashbrown::HashTable;

use crate::json::JsonError;

/// The first bytes of a snapshot.
const MAGIC: &[u8; 8] = b"OSDEDUP\0";
/// The snapshot format version this code writes and reads.
const VERSION: u32 = 1;
/// Magic, version, `window_ms`, `max_entries`, `last_now`, entry count.
const HEADER_LEN: usize = 8 + 4 + 8 + 8 + 8 + 8;
/// The smallest encoded entry: a tag, a time and a zero-length id.
const MIN_ENTRY_LEN: usize = 1 + 8 + 4;
const TAG_UUID: u8 = 0;
const TAG_OTHER: u8 = 1;

/// The 128-bit value of a canonical UUID (`8-4-4-4-12` hex digits, any case), or `None`.
#[must_use]
#[inline]
pub fn uuid_key(id: impl AsRef<[u8]>) -> Option<u128> {
    let b = id.as_ref();
    if b.len() != 36 || b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return None;
    }
    // Four runs of eight digits, each read as one big-endian u64 and decoded
    // eight digits at a time (SWAR): no table, no per-byte branch.
    let run = |at: [usize; 2]| -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&b[at[0]..at[0] + 4]);
        out[4..].copy_from_slice(&b[at[1]..at[1] + 4]);
        out
    };
    let runs = [run([0, 4]), run([9, 14]), run([19, 24]), run([28, 32])];
    let mut value = 0u128;
    let mut ok = true;
    for r in runs {
        let (digits, valid) = hex8(u64::from_be_bytes(r));
        ok &= valid;
        value = (value << 32) | u128::from(digits);
    }
    ok.then_some(value)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` (all below 0x80) that is strictly between `m` and `n`.
#[inline]
fn between(x: u64, m: u64, n: u64) -> u64 {
    // From "Bit Twiddling Hacks" (hasbetween): exact per byte for bytes below 0x80.
    let low = x & (ONES * 127);
    (ONES * (127 + n)).wrapping_sub(low) & !x & (low + ONES * (127 - m)) & HIGH
}

/// Eight ASCII hex digits (first digit in the top byte) as a u32, and whether all were digits.
#[inline]
fn hex8(x: u64) -> (u32, bool) {
    let digit = between(x, 0x2f, 0x3a); // '0'..='9'
                                        // OR 0x20 folds 'A'..'F' onto 'a'..'f' and leaves digits as they are.
    let letter = between(x | (ONES * 0x20), 0x60, 0x67); // 'a'..='f'
    let valid = (digit | letter) == HIGH && x & HIGH == 0;
    // '0'..'9' have low nibbles 0..9; letters have bit 0x40 and low nibbles 1..6.
    let mut v = (x & (ONES * 0x0f)) + ((x & (ONES * 0x40)) >> 6) * 9;
    v = (v | (v >> 4)) & 0x00ff_00ff_00ff_00ff;
    v = (v | (v >> 8)) & 0x0000_ffff_0000_ffff;
    v = (v | (v >> 16)) & 0x0000_0000_ffff_ffff;
    (v as u32, valid)
}

/// How the window tells ids apart, for callers that must agree with it:
/// canonical UUIDs by value (so letter case does not matter), other ids whole.
/// Parse an id once with [`IdKey::of`] and use the `_key` methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdKey<'a> {
    Uuid(u128),
    Other(&'a [u8]),
}

impl<'a> IdKey<'a> {
    #[must_use]
    #[inline]
    pub fn of(id: &'a [u8]) -> Self {
        uuid_key(id).map_or(IdKey::Other(id), IdKey::Uuid)
    }
}

/// An [`IdKey`] that owns its bytes, to keep in a set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnedIdKey {
    Uuid(u128),
    Other(Box<[u8]>),
}

impl From<IdKey<'_>> for OwnedIdKey {
    fn from(key: IdKey<'_>) -> Self {
        match key {
            IdKey::Uuid(k) => OwnedIdKey::Uuid(k),
            IdKey::Other(id) => OwnedIdKey::Other(id.into()),
        }
    }
}

/// The key an id is held under.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    /// A canonical UUID's value, as two halves (no 16-byte alignment in the ring).
    Uuid([u64; 2]),
    Other(Box<[u8]>),
    /// A ring entry whose id was forgotten; it leaves when it reaches the front.
    Dead,
}

impl Key {
    #[inline]
    fn uuid(k: u128) -> Self {
        Key::Uuid([(k >> 64) as u64, k as u64])
    }

    #[inline]
    fn matches(&self, key: IdKey<'_>) -> bool {
        match (self, key) {
            (Key::Uuid(halves), IdKey::Uuid(k)) => *halves == [(k >> 64) as u64, k as u64],
            (Key::Other(id), IdKey::Other(other)) => **id == *other,
            _ => false,
        }
    }

    fn as_id_key(&self) -> Option<IdKey<'_>> {
        match self {
            Key::Uuid([hi, lo]) => Some(IdKey::Uuid((u128::from(*hi) << 64) | u128::from(*lo))),
            Key::Other(id) => Some(IdKey::Other(id)),
            Key::Dead => None,
        }
    }
}

/// One ring entry, oldest first. Its sequence number is its place in the ring
/// plus [`DedupWindow::head_seq`].
#[derive(Clone, Debug)]
struct RingEntry {
    /// The key's hash, so that neither eviction nor a rehash reads the key.
    hash: u64,
    ts: i64,
    key: Key,
}

/// An exact, time- and count-bounded set of recently seen ids.
///
/// Each id is held once, in a time-ordered ring; a hash table holds only the
/// ring sequence numbers (4 bytes a bucket), found by the id's hash and
/// confirmed by comparing the id in the ring. Hash collisions therefore cost a
/// comparison, never a wrong answer.
///
/// Not synchronized: wrap it in a mutex to share it.
#[derive(Clone, Debug)]
pub struct DedupWindow {
    window_ms: u64,
    max_entries: usize,
    /// The latest time seen; `i64::MIN` before the first call.
    last_now: i64,
    /// The sequence numbers of the live ring entries.
    table: HashTable<u32>,
    /// Live and dead entries, oldest first; `ring[i]` has sequence number `head_seq + i`.
    ring: VecDeque<RingEntry>,
    head_seq: u32,
    /// Live entries (the ring also holds dead ones).
    live: usize,
    /// Heap bytes of the non-UUID keys held by the ring.
    other_key_bytes: usize,
    hasher: KeyHasher,
    /// The table's capacity after its last growth or rehash.
    table_capacity: usize,
}

/// How one window hashes ids (each window has its own seed, kept for its
/// whole life, through [`DedupWindow::clear`] too): a host sharing the window
/// between threads hashes a batch's ids with a copy of it before it takes the
/// window's lock.
#[derive(Clone, Debug)]
pub struct KeyHasher {
    state: foldhash::fast::RandomState,
    /// Every hash is AND-ed with this: all ones, or few bits in the tests that force collisions.
    mask: u64,
}

impl KeyHasher {
    fn new() -> Self {
        KeyHasher {
            state: foldhash::fast::RandomState::default(),
            mask: u64::MAX,
        }
    }

    /// The hash the window files `key` under (a UUID by its value, so letter case does not matter).
    #[must_use]
    #[inline]
    pub fn hash(&self, key: IdKey<'_>) -> u64 {
        let h = match key {
            IdKey::Uuid(k) => self.state.hash_one(k),
            IdKey::Other(id) => self.state.hash_one(id),
        };
        h & self.mask
    }
}

/// Whether an entry recorded at `ts` has left the window at `now` (`ts <= now`).
#[inline]
fn expired(ts: i64, now: i64, window_ms: u64) -> bool {
    debug_assert!(ts <= now);
    now.abs_diff(ts) >= window_ms
}

/// The most ids held whatever `max_entries` says, so that the ring (at most
/// twice the live entries, plus 64) is always numbered by a `u32`.
pub const MAX_LIVE: usize = 1 << 30;

/// The place in the ring of sequence number `seq` when the front has `head`.
#[inline]
fn pos(seq: u32, head: u32) -> usize {
    seq.wrapping_sub(head) as usize
}

/// The heap bytes a boxed id of `len` bytes takes.
#[inline]
fn key_bytes(len: usize) -> usize {
    len
}

impl DedupWindow {
    /// An empty window of `window_ms` milliseconds holding at most `max_entries` ids.
    ///
    /// # Panics
    ///
    /// If `window_ms` or `max_entries` is 0 (the Python wrapper checks them first).
    #[must_use]
    pub fn new(window_ms: u64, max_entries: usize) -> Self {
        assert!(window_ms >= 1, "window_ms must be at least 1");
        assert!(max_entries >= 1, "max_entries must be at least 1");
        DedupWindow {
            window_ms,
            max_entries,
            last_now: i64::MIN,
            table: HashTable::new(),
            ring: VecDeque::new(),
            head_seq: 0,
            live: 0,
            other_key_bytes: 0,
            hasher: KeyHasher::new(),
            table_capacity: 0,
        }
    }

    /// The hash of `key` (a UUID by its value, so letter case does not matter).
    #[inline]
    fn hash(&self, key: IdKey<'_>) -> u64 {
        self.hasher.hash(key)
    }

    /// A copy of how this window hashes ids, for hashing them before taking
    /// a lock around the window (the `_hashed` methods take its hashes).
    #[must_use]
    pub fn key_hasher(&self) -> KeyHasher {
        self.hasher.clone()
    }

    /// Move the clock to `max(now_ms, last_now)` and return it.
    #[inline]
    fn advance(&mut self, now_ms: i64) -> i64 {
        self.last_now = self.last_now.max(now_ms);
        self.last_now
    }

    /// The ring entry with sequence number `seq` (it must be in the ring).
    #[inline]
    fn entry(&self, seq: u32) -> &RingEntry {
        &self.ring[pos(seq, self.head_seq)]
    }

    /// The live entry holding `key`, if any.
    #[inline]
    fn find(&self, key: IdKey<'_>, hash: u64) -> Option<&RingEntry> {
        let ring = &self.ring;
        let head = self.head_seq;
        self.table
            .find(hash, |&seq| ring[pos(seq, head)].key.matches(key))
            .map(|&seq| self.entry(seq))
    }

    /// Pop the ring's front entry; remove it from the table when it is live.
    /// Returns whether it was live.
    fn pop_front(&mut self) -> bool {
        let Some(entry) = self.ring.pop_front() else {
            return false;
        };
        let seq = self.head_seq;
        self.head_seq = self.head_seq.wrapping_add(1);
        match entry.key {
            Key::Dead => false,
            key => {
                // Found by its hash and sequence number: the key itself is not read.
                if let Ok(found) = self.table.find_entry(entry.hash, |&s| s == seq) {
                    found.remove();
                }
                if let Key::Other(id) = key {
                    self.other_key_bytes -= key_bytes(id.len());
                }
                self.live -= 1;
                true
            }
        }
    }

    /// Drop the entries that left the window at `now`; returns how many live ones went.
    #[inline]
    fn expire_to(&mut self, now: i64) -> usize {
        let mut dropped = 0;
        while let Some(front) = self.ring.front() {
            if !expired(front.ts, now, self.window_ms) {
                break;
            }
            if self.pop_front() {
                dropped += 1;
            }
        }
        dropped
    }

    /// Evict the oldest entries while more than `max_entries` are held.
    #[inline]
    fn enforce_count(&mut self) {
        while self.live > self.max_entries.min(MAX_LIVE) {
            if !self.pop_front() && self.ring.is_empty() {
                break;
            }
        }
    }

    /// Drop the dead ring entries once they outnumber the live ones, renumbering the rest.
    fn maybe_compact(&mut self) {
        if self.ring.len() <= 2 * self.live + 64 {
            return;
        }
        self.ring.retain(|e| !matches!(e.key, Key::Dead));
        self.ring.shrink_to(self.live.max(64));
        self.table.clear();
        self.table_capacity = self.table.capacity();
        let base = self.head_seq;
        for (i, e) in self.ring.iter().enumerate() {
            let ring = &self.ring;
            self.table
                .insert_unique(e.hash, base.wrapping_add(i as u32), |&s| {
                    ring[pos(s, base)].hash
                });
        }
    }

    /// Make room in the table for one more id.
    ///
    /// Once the window is half full, the table grows straight to twice
    /// `max_entries`, the size a full window's churn ends at anyway: hashbrown
    /// clears the tombstones of removed ids in place only while the table is
    /// at most half full, and grows it otherwise. Growing early moves half as
    /// many ids, and never just as the window starts to evict.
    #[inline]
    fn make_room(&mut self) {
        if self.table.len() < self.table.capacity() {
            return;
        }
        self.grow();
    }

    #[cold]
    fn grow(&mut self) {
        let len = self.table.len();
        let most = self.max_entries.min(MAX_LIVE);
        let want = if 2 * len >= most {
            most.saturating_mul(2)
        } else {
            (2 * len).max(16)
        };
        // Already that large: the buckets went to tombstones, rebuild at the
        // same size.
        self.rebuild_table(want.max(self.table_capacity).max(len + 1));
    }

    /// Replace the table with one of room for `capacity` ids, filled from
    /// the ring in its order.
    ///
    /// Growing the table in place would rehash each id by reading its hash in
    /// the ring: one read a bucket, in table order, so all over a ring that
    /// is larger than the cache. Filling a new table reads the ring front to
    /// back, and writes only the new table, which a core's cache holds
    /// (measured: a growth costs about half as much).
    #[cold]
    fn rebuild_table(&mut self, capacity: usize) {
        let mut table = HashTable::with_capacity(capacity);
        let ring = &self.ring;
        let head = self.head_seq;
        for (i, e) in ring.iter().enumerate() {
            if !matches!(e.key, Key::Dead) {
                table.insert_unique(e.hash, head.wrapping_add(i as u32), |&s| {
                    ring[pos(s, head)].hash
                });
            }
        }
        self.table = table;
        self.table_capacity = self.table.capacity();
    }

    /// Make room at once for up to `n` ids about to be recorded (a batch the
    /// ingestor is about to screen): the table grows once, to the size its
    /// doublings would reach, instead of moving every id at each doubling.
    /// Never beyond twice `max_entries`, where `make_room` stops growing too.
    pub fn reserve(&mut self, n: usize) {
        let len = self.table.len();
        let most = self.max_entries.min(MAX_LIVE);
        let want = len.saturating_add(n).min(most.saturating_mul(2));
        if want <= self.table.capacity() {
            return;
        }
        // At least doubled, as growing in place would: a window reserving a
        // little at a time still moves each id a bounded number of times.
        let doubled = self.table.capacity().saturating_mul(2);
        self.rebuild_table(want.max(doubled.min(most.saturating_mul(2))));
        // The time ring grows with the table, once.
        self.ring.reserve(want - len);
    }

    /// Record `key` (absent from the window) at time `ts`.
    #[inline]
    fn insert(&mut self, key: IdKey<'_>, hash: u64, ts: i64) {
        self.make_room();
        let seq = self.head_seq.wrapping_add(self.ring.len() as u32);
        self.push_entry(key, hash, ts);
        let ring = &self.ring;
        let head = self.head_seq;
        self.table
            .insert_unique(hash, seq, |&s| ring[pos(s, head)].hash);
    }

    /// Append `key`'s ring entry (its table bucket is the caller's to fill).
    #[inline]
    fn push_entry(&mut self, key: IdKey<'_>, hash: u64, ts: i64) {
        let key = match key {
            IdKey::Uuid(k) => Key::uuid(k),
            IdKey::Other(id) => {
                self.other_key_bytes += key_bytes(id.len());
                Key::Other(id.into())
            }
        };
        self.ring.push_back(RingEntry { hash, ts, key });
        self.live += 1;
    }

    /// `true` the first time `id` is seen within the window (it is then recorded),
    /// `false` for a duplicate.
    pub fn check_and_insert(&mut self, id: impl AsRef<[u8]>, now_ms: i64) -> bool {
        self.check_and_insert_key(IdKey::of(id.as_ref()), now_ms)
    }

    /// [`DedupWindow::check_and_insert`] for an id already parsed.
    #[inline]
    pub fn check_and_insert_key(&mut self, key: IdKey<'_>, now_ms: i64) -> bool {
        self.check_and_insert_hashed(key, self.hash(key), now_ms)
    }

    /// [`DedupWindow::check_and_insert_key`] with `hash` from [`KeyHasher::hash`] of [`DedupWindow::key_hasher`].
    #[inline]
    pub(crate) fn check_and_insert_hashed(
        &mut self,
        key: IdKey<'_>,
        hash: u64,
        now_ms: i64,
    ) -> bool {
        let now = self.advance(now_ms);
        self.expire_to(now);
        // One probe finds the id or the free bucket it goes into.
        self.make_room();
        let seq = self.head_seq.wrapping_add(self.ring.len() as u32);
        let ring = &self.ring;
        let head = self.head_seq;
        match self.table.entry(
            hash,
            |&s| ring[pos(s, head)].key.matches(key),
            |&s| ring[pos(s, head)].hash,
        ) {
            hashbrown::hash_table::Entry::Occupied(_) => return false,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(seq);
            }
        }
        self.push_entry(key, hash, now);
        self.enforce_count();
        true
    }

    /// Record `key`, which the caller found absent with
    /// [`DedupWindow::contains_hashed`] after [`DedupWindow::expire`] at
    /// `now_ms`, the window unchanged since but for other such inserts of
    /// distinct keys: [`DedupWindow::check_and_insert_hashed`] without looking
    /// the key up again.
    #[inline]
    pub(crate) fn insert_absent_hashed(&mut self, key: IdKey<'_>, hash: u64, now_ms: i64) {
        debug_assert!(self.find(key, hash).is_none(), "the key is held already");
        let now = self.advance(now_ms);
        self.insert(key, hash, now);
        self.enforce_count();
    }

    /// [`DedupWindow::check_and_insert_key`] for each key in order, all at time
    /// `now_ms`, the answers pushed onto `out`.
    // Probing the table a few keys ahead (a prefetch in safe code) was tried
    // here and measured slower: the extra probes cost more than the overlap won.
    pub fn check_and_insert_keys<'k>(
        &mut self,
        keys: impl IntoIterator<Item = IdKey<'k>>,
        now_ms: i64,
        out: &mut Vec<bool>,
    ) {
        out.extend(
            keys.into_iter()
                .map(|key| self.check_and_insert_key(key, now_ms)),
        );
    }

    /// Whether `id` is in the window, without recording it or expiring anything.
    ///
    /// An entry that has left the window at the latest time seen counts as absent.
    #[must_use]
    pub fn contains(&self, id: impl AsRef<[u8]>) -> bool {
        self.contains_key(IdKey::of(id.as_ref()))
    }

    /// [`DedupWindow::contains`] for an id already parsed.
    #[must_use]
    pub fn contains_key(&self, key: IdKey<'_>) -> bool {
        self.contains_hashed(key, self.hash(key))
    }

    /// [`DedupWindow::contains_key`] with `hash` from [`KeyHasher::hash`] of [`DedupWindow::key_hasher`].
    #[must_use]
    #[inline]
    pub(crate) fn contains_hashed(&self, key: IdKey<'_>, hash: u64) -> bool {
        self.find(key, hash)
            .is_some_and(|e| !expired(e.ts, self.last_now, self.window_ms))
    }

    /// Remove `id` (the ingestor un-records the events its queue refused).
    /// Returns whether it was held.
    pub fn forget(&mut self, id: impl AsRef<[u8]>) -> bool {
        let key = IdKey::of(id.as_ref());
        let hash = self.hash(key);
        let ring = &self.ring;
        let head = self.head_seq;
        let Ok(found) = self
            .table
            .find_entry(hash, |&seq| ring[pos(seq, head)].key.matches(key))
        else {
            return false;
        };
        let (seq, _) = found.remove();
        self.live -= 1;
        let index = pos(seq, self.head_seq);
        let old = if index + 1 == self.ring.len() {
            // The newest entry (the usual case for the ingestor) leaves the ring at once.
            self.ring.pop_back().map(|e| e.key)
        } else {
            Some(std::mem::replace(&mut self.ring[index].key, Key::Dead))
        };
        if let Some(Key::Other(id)) = old {
            self.other_key_bytes -= key_bytes(id.len());
        }
        self.maybe_compact();
        true
    }

    /// Drop the entries that left the window at `now_ms`; returns how many were dropped.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let now = self.advance(now_ms);
        self.expire_to(now)
    }

    /// How many ids are held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no id is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every id and release the tables' memory; the clock is kept.
    pub fn clear(&mut self) {
        self.table = HashTable::new();
        self.table_capacity = 0;
        self.ring = VecDeque::new();
        self.head_seq = 0;
        self.live = 0;
        self.other_key_bytes = 0;
    }

    /// An estimate of the bytes held by the tables, from their capacities.
    #[must_use]
    pub fn memory_usage(&self) -> usize {
        // A hash table stores its entries and one control byte per bucket.
        let capacity = self.table.capacity();
        let table = if capacity == 0 {
            0
        } else {
            (capacity * 8 / 7).next_power_of_two() * (size_of::<u32>() + 1)
        };
        size_of::<Self>()
            + table
            + self.ring.capacity() * size_of::<RingEntry>()
            + self.other_key_bytes
    }

    /// The window's length in milliseconds.
    #[must_use]
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The most ids held at once.
    #[must_use]
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The window's state as bytes, for [`restore`](Self::restore).
    ///
    /// Format (version 1, integers little-endian): the magic `OSDEDUP\0`, the
    /// version (u32), `window_ms` (u64), `max_entries` (u64), the latest time
    /// seen (i64), the entry count (u64), then each entry oldest first: a tag
    /// (0: UUID, 1: other id), its time (i64), then the UUID's 16 bytes in their
    /// usual order, or the id's length (u32) and its UTF-8 bytes.
    #[must_use]
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_LEN + self.len() * (1 + 8 + 16) + self.other_key_bytes);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.window_ms.to_le_bytes());
        out.extend_from_slice(&(self.max_entries as u64).to_le_bytes());
        out.extend_from_slice(&self.last_now.to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        for entry in &self.ring {
            match entry.key.as_id_key() {
                Some(IdKey::Uuid(k)) => {
                    out.push(TAG_UUID);
                    out.extend_from_slice(&entry.ts.to_le_bytes());
                    out.extend_from_slice(&k.to_be_bytes());
                }
                Some(IdKey::Other(k)) => {
                    out.push(TAG_OTHER);
                    out.extend_from_slice(&entry.ts.to_le_bytes());
                    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    out.extend_from_slice(k);
                }
                None => {}
            }
        }
        out
    }

    /// A window from [`snapshot`](Self::snapshot) bytes.
    ///
    /// Every malformed input (truncated, wrong magic or version, bad lengths or
    /// values, entries out of order, trailing bytes) is an error naming the
    /// byte offset.
    pub fn restore(data: &[u8]) -> Result<Self, JsonError> {
        let mut r = Reader { data, pos: 0 };
        let magic = r.take(MAGIC.len(), "magic")?;
        if magic != MAGIC {
            return Err(JsonError::at(0, "not a dedup window snapshot (bad magic)"));
        }
        let at = r.pos;
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(JsonError::at(
                at,
                format!("unsupported dedup snapshot version {version} (expected {VERSION})"),
            ));
        }
        let at = r.pos;
        let window_ms = r.u64("window_ms")?;
        if window_ms == 0 {
            return Err(JsonError::at(at, "window_ms must be at least 1"));
        }
        let at = r.pos;
        let max_entries = usize::try_from(r.u64("max_entries")?)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| {
                JsonError::at(at, "max_entries must be between 1 and the platform's limit")
            })?;
        let last_now = r.i64("last_now")?;
        let at = r.pos;
        let count = r.u64("entry count")?;
        if count > max_entries as u64 {
            return Err(JsonError::at(
                at,
                format!("{count} entries exceed max_entries {max_entries}"),
            ));
        }
        if count > (r.remaining() / MIN_ENTRY_LEN) as u64 {
            return Err(JsonError::at(
                at,
                format!("{count} entries cannot fit in {} bytes", r.remaining()),
            ));
        }
        let count = count as usize;

        let mut window = DedupWindow::new(window_ms, max_entries);
        window.last_now = last_now;
        window.ring.reserve(count);
        // The table is empty: the hasher is never called.
        window.table.reserve(count, |_| 0);
        window.table_capacity = window.table.capacity();
        for _ in 0..count {
            window.restore_entry(&mut r)?;
        }
        if r.remaining() != 0 {
            return Err(JsonError::at(
                r.pos,
                format!("{} trailing bytes after the snapshot", r.remaining()),
            ));
        }
        Ok(window)
    }
}

impl DedupWindow {
    /// Read one snapshot entry and record it, checking it against the entries before it.
    fn restore_entry(&mut self, r: &mut Reader<'_>) -> Result<(), JsonError> {
        let entry_at = r.pos;
        let tag = r.u8("entry tag")?;
        let ts_at = r.pos;
        let ts = r.i64("entry time")?;
        if self.ring.back().is_some_and(|prev| ts < prev.ts) {
            return Err(JsonError::at(ts_at, "entry times are not in order"));
        }
        if ts > self.last_now {
            return Err(JsonError::at(
                ts_at,
                "entry time is after the latest time seen",
            ));
        }
        if expired(ts, self.last_now, self.window_ms) {
            return Err(JsonError::at(ts_at, "entry time is outside the window"));
        }
        let id: IdKey<'_> = match tag {
            TAG_UUID => IdKey::Uuid(r.u128("uuid")?),
            TAG_OTHER => {
                let len = r.u32("id length")? as usize;
                let bytes_at = r.pos;
                let bytes = r.take(len, "id")?;
                let id = std::str::from_utf8(bytes)
                    .map_err(|e| JsonError::at(bytes_at + e.valid_up_to(), "id is not UTF-8"))?;
                if uuid_key(id).is_some() {
                    return Err(JsonError::at(bytes_at, "a UUID id stored as a plain id"));
                }
                IdKey::Other(bytes)
            }
            other => {
                return Err(JsonError::at(
                    entry_at,
                    format!("unknown entry tag {other}"),
                ))
            }
        };
        let hash = self.hash(id);
        if self.find(id, hash).is_some() {
            return Err(JsonError::at(entry_at, "duplicate entry"));
        }
        self.insert(id, hash, ts);
        Ok(())
    }
}

/// A bounds-checked little-endian reader over snapshot bytes.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], JsonError> {
        if self.remaining() < n {
            return Err(JsonError::at(
                self.data.len(),
                format!(
                    "dedup snapshot truncated: {what} needs {n} bytes, {} left",
                    self.remaining()
                ),
            ));
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], JsonError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, JsonError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, JsonError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, JsonError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn i64(&mut self, what: &str) -> Result<i64, JsonError> {
        self.array(what).map(i64::from_le_bytes)
    }

    fn u128(&mut self, what: &str) -> Result<u128, JsonError> {
        self.array(what).map(u128::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
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
}
