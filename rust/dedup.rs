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

mod snapshot;

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
}

#[cfg(test)]
mod tests;
