//! Snapshots: a window's state as bytes ([`DedupWindow::snapshot`]) and a
//! window made again from them ([`DedupWindow::restore`]), every field of the
//! input checked.

use super::{expired, uuid_key, DedupWindow, IdKey};
use crate::json::JsonError;

/// The first bytes of a snapshot.
pub(super) const MAGIC: &[u8; 8] = b"OSDEDUP\0";
/// The snapshot format version this code writes and reads.
pub(super) const VERSION: u32 = 1;
/// Magic, version, `window_ms`, `max_entries`, `last_now`, entry count.
pub(super) const HEADER_LEN: usize = 8 + 4 + 8 + 8 + 8 + 8;
/// The smallest encoded entry: a tag, a time and a zero-length id.
pub(super) const MIN_ENTRY_LEN: usize = 1 + 8 + 4;
pub(super) const TAG_UUID: u8 = 0;
pub(super) const TAG_OTHER: u8 = 1;

impl DedupWindow {
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
