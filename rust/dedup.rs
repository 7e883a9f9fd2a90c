//! Exact sliding-window de-duplication of event ids.
//!
//! An id is a duplicate when it was first seen less than `window_ms` ago and is
//! among the last `max_entries` ids recorded. The window is exact: canonical
//! UUIDs are held as 128-bit integers in one table (so case does not matter),
//! every other id is held whole in a second table. There is no lossy hash, so
//! there are no false positives.
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
//! Expiry and the count bound use a time-ordered ring of `(ts, key, seq)`;
//! each operation is amortized O(1). [`DedupWindow::forget`] leaves its ring
//! entry behind: the sequence number stored in the table tells a live ring
//! entry from a stale one, and the ring is compacted when stale entries
//! outnumber live ones.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::mem::size_of;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};

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
    // Each digit's value, or 0x10 for a byte that is not a hex digit; OR-ing
    // the values together flags a bad digit anywhere at once. Two 64-bit
    // halves: independent chains of plain shifts.
    let mut halves = [0u64; 2];
    let mut bad = 0u8;
    for (half, digits) in halves.iter_mut().zip(UUID_DIGITS.chunks_exact(16)) {
        for &i in digits {
            let d = HEX[b[i] as usize];
            bad |= d;
            *half = (*half << 4) | u64::from(d & 0x0f);
        }
    }
    (bad < 0x10).then_some((u128::from(halves[0]) << 64) | u128::from(halves[1]))
}

/// Where the 32 hex digits of a canonical UUID stand.
const UUID_DIGITS: [usize; 32] = {
    let mut out = [0usize; 32];
    let mut i = 0;
    let mut pos = 0;
    while pos < 36 {
        if !(pos == 8 || pos == 13 || pos == 18 || pos == 23) {
            out[i] = pos;
            i += 1;
        }
        pos += 1;
    }
    out
};

/// Hex digit values; 0x10 for every other byte.
static HEX: [u8; 256] = {
    let mut t = [0x10u8; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        t[b'A' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};

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
    Uuid(u128),
    Other(Arc<[u8]>),
}

/// What the tables hold for a live entry.
#[derive(Clone, Copy, Debug)]
struct Slot {
    ts: i64,
    seq: u64,
}

/// One ring entry, oldest first; stale when the table's slot has another `seq` (or is gone).
#[derive(Clone, Debug)]
struct RingEntry {
    ts: i64,
    seq: u64,
    key: Key,
}

/// An exact, time- and count-bounded set of recently seen ids.
///
/// Not synchronized: wrap it in a mutex to share it.
#[derive(Clone, Debug)]
pub struct DedupWindow {
    window_ms: u64,
    max_entries: usize,
    /// The latest time seen; `i64::MIN` before the first call.
    last_now: i64,
    uuids: HashMap<u128, Slot>,
    others: HashMap<Arc<[u8]>, Slot>,
    ring: VecDeque<RingEntry>,
    next_seq: u64,
    /// Heap bytes of the non-UUID keys held by the ring (each ring entry owns one allocation).
    other_key_bytes: usize,
}

/// Whether an entry recorded at `ts` has left the window at `now` (`ts <= now`).
#[inline]
fn expired(ts: i64, now: i64, window_ms: u64) -> bool {
    debug_assert!(ts <= now);
    now.abs_diff(ts) >= window_ms
}

/// The heap bytes an `Arc<[u8]>` of `len` bytes takes: two counters and the bytes.
#[inline]
fn arc_bytes(len: usize) -> usize {
    2 * size_of::<usize>() + len
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
            uuids: HashMap::new(),
            others: HashMap::new(),
            ring: VecDeque::new(),
            next_seq: 0,
            other_key_bytes: 0,
        }
    }

    /// Move the clock to `max(now_ms, last_now)` and return it.
    #[inline]
    fn advance(&mut self, now_ms: i64) -> i64 {
        self.last_now = self.last_now.max(now_ms);
        self.last_now
    }

    #[inline]
    fn slot(&self, key: &Key) -> Option<Slot> {
        match key {
            Key::Uuid(k) => self.uuids.get(k).copied(),
            Key::Other(k) => self.others.get(&**k).copied(),
        }
    }

    #[inline]
    fn is_live(&self, entry: &RingEntry) -> bool {
        self.slot(&entry.key)
            .is_some_and(|slot| slot.seq == entry.seq)
    }

    /// Pop the ring's front entry; remove it from its table when it is live.
    /// Returns whether it was live.
    fn pop_front(&mut self) -> bool {
        let Some(entry) = self.ring.pop_front() else {
            return false;
        };
        // One lookup in the common case: remove, and put back the rare slot
        // that a later insertion of the same id (after a `forget`) owns.
        let live = match &entry.key {
            Key::Uuid(k) => match self.uuids.remove(k) {
                Some(slot) if slot.seq != entry.seq => {
                    self.uuids.insert(*k, slot);
                    false
                }
                removed => removed.is_some(),
            },
            Key::Other(k) => match self.others.remove_entry(&**k) {
                Some((key, slot)) if slot.seq != entry.seq => {
                    self.others.insert(key, slot);
                    false
                }
                removed => removed.is_some(),
            },
        };
        if let Key::Other(k) = &entry.key {
            self.other_key_bytes -= arc_bytes(k.len());
        }
        live
    }

    /// Drop the entries that left the window at `now`; returns how many live ones went.
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
    fn enforce_count(&mut self) {
        while self.len() > self.max_entries {
            if self.ring.is_empty() {
                break;
            }
            self.pop_front();
        }
    }

    /// Drop the stale ring entries once they outnumber the live ones.
    fn maybe_compact(&mut self) {
        let live = self.len();
        if self.ring.len() <= 2 * live + 64 {
            return;
        }
        let ring = std::mem::take(&mut self.ring);
        let mut kept = VecDeque::with_capacity(live);
        let mut key_bytes = 0;
        for entry in ring {
            if self.is_live(&entry) {
                if let Key::Other(k) = &entry.key {
                    key_bytes += arc_bytes(k.len());
                }
                kept.push_back(entry);
            }
        }
        self.ring = kept;
        self.other_key_bytes = key_bytes;
    }

    /// Record `key` at time `ts` (it must be absent).
    fn insert(&mut self, key: Key, ts: i64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = Slot { ts, seq };
        match &key {
            Key::Uuid(k) => {
                self.uuids.insert(*k, slot);
            }
            Key::Other(k) => {
                self.other_key_bytes += arc_bytes(k.len());
                self.others.insert(Arc::clone(k), slot);
            }
        }
        self.ring.push_back(RingEntry { ts, seq, key });
    }

    /// `true` the first time `id` is seen within the window (it is then recorded),
    /// `false` for a duplicate.
    pub fn check_and_insert(&mut self, id: impl AsRef<[u8]>, now_ms: i64) -> bool {
        self.check_and_insert_key(IdKey::of(id.as_ref()), now_ms)
    }

    /// [`DedupWindow::check_and_insert`] for an id already parsed.
    pub fn check_and_insert_key(&mut self, key: IdKey<'_>, now_ms: i64) -> bool {
        let now = self.advance(now_ms);
        self.expire_to(now);
        let key = match key {
            IdKey::Uuid(k) => {
                // One lookup for the common case: probe and insert together.
                let seq = self.next_seq;
                match self.uuids.entry(k) {
                    Entry::Occupied(_) => return false,
                    Entry::Vacant(v) => {
                        v.insert(Slot { ts: now, seq });
                    }
                }
                self.next_seq += 1;
                self.ring.push_back(RingEntry {
                    ts: now,
                    seq,
                    key: Key::Uuid(k),
                });
                self.enforce_count();
                return true;
            }
            IdKey::Other(id) => {
                if self.others.contains_key(id) {
                    return false;
                }
                Key::Other(Arc::from(id))
            }
        };
        self.insert(key, now);
        self.enforce_count();
        true
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
        let slot = match key {
            IdKey::Uuid(k) => self.uuids.get(&k),
            IdKey::Other(id) => self.others.get(id),
        };
        slot.is_some_and(|slot| !expired(slot.ts, self.last_now, self.window_ms))
    }

    /// Remove `id` (the ingestor un-records the events its queue refused).
    /// Returns whether it was held.
    pub fn forget(&mut self, id: impl AsRef<[u8]>) -> bool {
        let id = id.as_ref();
        let removed = match uuid_key(id) {
            Some(k) => self.uuids.remove(&k),
            None => self.others.remove(id),
        };
        let Some(slot) = removed else {
            return false;
        };
        // The newest entry (the usual case for the ingestor) leaves the ring at once.
        if self.ring.back().is_some_and(|back| back.seq == slot.seq) {
            if let Some(RingEntry {
                key: Key::Other(k), ..
            }) = self.ring.pop_back()
            {
                self.other_key_bytes -= arc_bytes(k.len());
            }
        } else {
            self.maybe_compact();
        }
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
        self.uuids.len() + self.others.len()
    }

    /// Whether no id is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every id and release the tables' memory; the clock is kept.
    pub fn clear(&mut self) {
        self.uuids = HashMap::new();
        self.others = HashMap::new();
        self.ring = VecDeque::new();
        self.other_key_bytes = 0;
    }

    /// An estimate of the bytes held by the tables, from their capacities.
    #[must_use]
    pub fn memory_usage(&self) -> usize {
        // A hash table stores its entries and one control byte per bucket.
        let table = |capacity: usize, entry: usize| {
            if capacity == 0 {
                0
            } else {
                (capacity * 8 / 7).next_power_of_two() * (entry + 1)
            }
        };
        size_of::<Self>()
            + table(self.uuids.capacity(), size_of::<(u128, Slot)>())
            + table(self.others.capacity(), size_of::<(Arc<[u8]>, Slot)>())
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
        for entry in self.ring.iter().filter(|e| self.is_live(e)) {
            match &entry.key {
                Key::Uuid(k) => {
                    out.push(TAG_UUID);
                    out.extend_from_slice(&entry.ts.to_le_bytes());
                    out.extend_from_slice(&k.to_be_bytes());
                }
                Key::Other(k) => {
                    out.push(TAG_OTHER);
                    out.extend_from_slice(&entry.ts.to_le_bytes());
                    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    out.extend_from_slice(k);
                }
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
        let key = match tag {
            TAG_UUID => {
                let k = r.u128("uuid")?;
                if self.uuids.contains_key(&k) {
                    return Err(JsonError::at(entry_at, "duplicate entry"));
                }
                Key::Uuid(k)
            }
            TAG_OTHER => {
                let len = r.u32("id length")? as usize;
                let bytes_at = r.pos;
                let bytes = r.take(len, "id")?;
                let id = std::str::from_utf8(bytes)
                    .map_err(|e| JsonError::at(bytes_at + e.valid_up_to(), "id is not UTF-8"))?;
                if uuid_key(id).is_some() {
                    return Err(JsonError::at(bytes_at, "a UUID id stored as a plain id"));
                }
                if self.others.contains_key(bytes) {
                    return Err(JsonError::at(entry_at, "duplicate entry"));
                }
                Key::Other(Arc::from(bytes))
            }
            other => {
                return Err(JsonError::at(
                    entry_at,
                    format!("unknown entry tag {other}"),
                ))
            }
        };
        self.insert(key, ts);
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

    const U1: &str = "123e4567-e89b-42d3-a456-426614174000";
    const U2: &str = "00000000-0000-4000-8000-000000000002";

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
                    arc_bytes(k.len())
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
        assert!(uuids >= empty + 1000 * (size_of::<(u128, Slot)>() + size_of::<RingEntry>()));
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
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
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
}
