//! A validating JSON scanner over bytes, with limits on depth, and the error type
//! shared by every decoder of the core.

use std::fmt;

mod scan;

pub use scan::Scanner;

/// Why bytes could not be decoded: a message, and where possible the wire field
/// and the byte offset.
///
/// Boxed, so that the `Result`s of the hot decoding paths stay small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError(Box<JsonErrorInner>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonErrorInner {
    pub message: String,
    pub field: Option<String>,
    pub offset: Option<usize>,
}

impl std::ops::Deref for JsonError {
    type Target = JsonErrorInner;
    fn deref(&self) -> &JsonErrorInner {
        &self.0
    }
}

impl JsonError {
    #[cold]
    #[must_use]
    pub fn at(offset: usize, message: impl Into<String>) -> Self {
        JsonError(Box::new(JsonErrorInner {
            message: message.into(),
            field: None,
            offset: Some(offset),
        }))
    }

    #[cold]
    #[must_use]
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        JsonError(Box::new(JsonErrorInner {
            message: message.into(),
            field: Some(field.into()),
            offset: None,
        }))
    }

    /// The same error, attributed to `field`.
    #[cold]
    #[must_use]
    pub fn in_field(mut self, field: impl Into<String>) -> Self {
        self.0.field = Some(field.into());
        self
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(field) = &self.field {
            write!(f, "field '{field}': ")?;
        }
        f.write_str(&self.message)?;
        if let Some(offset) = self.offset {
            write!(f, " at byte {offset}")?;
        }
        Ok(())
    }
}

impl std::error::Error for JsonError {}

/// Largest input a decoder accepts unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;
/// Deepest nesting of arrays and objects a decoder accepts unless told otherwise.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// The deepest nesting any decoder accepts, whatever its `max_depth` says: the
/// scanner and the conversion to Python recurse once per level, and this keeps
/// them well inside the smallest thread stacks.
pub const MAX_DEPTH: usize = 512;

/// The longest integer literal accepted (the default limit of `CPython` for converting
/// digits to an `int`).
pub const MAX_INT_DIGITS: usize = 4300;

/// Limits that protect the process from hostile input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// The contents of a JSON string (between the quotes) as a byte range of the
/// input, and whether they hold a backslash escape.
///
/// Eight bytes, so it travels in a register: offsets are `u32` (inputs are
/// limited to [`MAX_INPUT`]) and the escape flag is the top bit of the end.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    start: u32,
    end_flag: u32,
}

/// The largest input any decoder accepts, whatever its `max_bytes` says: 2 GiB - 1.
pub const MAX_INPUT: usize = (1 << 31) - 1;

const ESCAPED: u32 = 1 << 31;

impl Span {
    #[inline]
    #[must_use]
    pub fn new(start: usize, end: usize, escaped: bool) -> Self {
        Span {
            start: start as u32,
            end_flag: end as u32 | if escaped { ESCAPED } else { 0 },
        }
    }

    #[inline]
    #[must_use]
    pub fn start(self) -> usize {
        self.start as usize
    }

    #[inline]
    #[must_use]
    pub fn end(self) -> usize {
        (self.end_flag & !ESCAPED) as usize
    }

    /// True when the contents hold a backslash escape and must be unescaped.
    #[inline]
    #[must_use]
    pub fn escaped(self) -> bool {
        self.end_flag & ESCAPED != 0
    }

    /// The byte range.
    #[inline]
    #[must_use]
    pub fn range(self) -> std::ops::Range<usize> {
        self.start()..self.end()
    }

    /// The raw bytes between the quotes.
    #[inline]
    #[must_use]
    pub fn raw(self, buf: &[u8]) -> &[u8] {
        &buf[self.start()..self.end()]
    }

    /// The string this span denotes, unescaped when needed.
    ///
    /// The span must come from a [`Scanner`] over `buf`, which has validated it.
    #[must_use]
    pub fn as_str(self, buf: &[u8]) -> std::borrow::Cow<'_, str> {
        let raw = str_unchecked(self.raw(buf));
        if self.escaped() {
            std::borrow::Cow::Owned(unescape(raw))
        } else {
            std::borrow::Cow::Borrowed(raw)
        }
    }

    /// The string's UTF-8 bytes, unescaped when needed (borrowed when not).
    #[must_use]
    pub fn as_bytes(self, buf: &[u8]) -> std::borrow::Cow<'_, [u8]> {
        if self.escaped() {
            std::borrow::Cow::Owned(unescape(str_unchecked(self.raw(buf))).into_bytes())
        } else {
            std::borrow::Cow::Borrowed(self.raw(buf))
        }
    }

    #[must_use]
    pub fn is_empty(self) -> bool {
        self.start() == self.end()
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Span({}..{}{})",
            self.start(),
            self.end(),
            if self.escaped() { ", escaped" } else { "" }
        )
    }
}

/// The names of one object's members seen so far, to refuse duplicates in
/// linear time: a short list while it is short, then a hash set.
#[derive(Default)]
pub struct KeySet<'a> {
    few: Vec<std::borrow::Cow<'a, str>>,
    many: Option<std::collections::HashSet<std::borrow::Cow<'a, str>>>,
}

impl<'a> KeySet<'a> {
    const FEW: usize = 8;

    /// Record `key`; false when it was already there.
    pub fn insert(&mut self, key: std::borrow::Cow<'a, str>) -> bool {
        if let Some(set) = &mut self.many {
            return set.insert(key);
        }
        if self.few.contains(&key) {
            return false;
        }
        self.few.push(key);
        if self.few.len() > Self::FEW {
            self.many = Some(self.few.drain(..).collect());
        }
        true
    }
}

/// The kind of a JSON value, as seen from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    True,
    False,
    Null,
}

impl Kind {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::True | Kind::False => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// Bytes already checked to be UTF-8 (the scanner validates its whole input first).
fn str_unchecked(bytes: &[u8]) -> &str {
    // The scanner validated the whole buffer and spans never split a code point,
    // so this cannot fail; fall back to an empty string rather than panic.
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Bytes that end the fast path of a string scan: quote, backslash, control
/// characters, and bytes that are not ASCII.
static NEEDS_CARE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i < 0x20 || i >= 0x80 || i == b'"' as usize || i == b'\\' as usize;
        i += 1;
    }
    t
};

/// The index of the first byte at or after `i` that [`NEEDS_CARE`], or `buf.len()`.
///
/// Eight bytes at a time: a byte is flagged when it equals `"` or `\\`, is
/// below 0x20, or has its high bit set. The carries of the zero-byte trick can
/// only flag bytes above a true match, so the lowest flag is exact. (Measured:
/// sixteen at a time, two words a branch, is slower, most strings being short;
/// so is a first pass over the line to learn it is printable ASCII, which would
/// leave only `"` and `\\` to look for.)
#[inline(always)]
pub(crate) fn find_special(buf: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = buf.get(i..i + 8) {
        let flags = special_flags(word(chunk));
        if flags != 0 {
            return i + (flags.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < buf.len() && !NEEDS_CARE[buf[i] as usize] {
        i += 1;
    }
    i
}

/// Eight bytes (the caller passes exactly eight) as a little-endian word.
#[inline(always)]
fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// The high bit of each byte of `w` that [`NEEDS_CARE`], possibly with false
/// flags above the lowest true one.
#[inline(always)]
fn special_flags(w: u64) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let quote = w ^ (LO * u64::from(b'"'));
    let slash = w ^ (LO * u64::from(b'\\'));
    ((quote.wrapping_sub(LO) & !quote)
        | (slash.wrapping_sub(LO) & !slash)
        | (w.wrapping_sub(LO * 0x20) & !w)
        | w)
        & HI
}

fn hex4(buf: &[u8], i: usize) -> Option<u32> {
    let digits = buf.get(i..i + 4)?;
    let mut v = 0u32;
    for &d in digits {
        v = v * 16 + (d as char).to_digit(16)?;
    }
    Some(v)
}

/// Unescape the contents of a JSON string already validated by a [`Scanner`].
#[must_use]
pub fn unescape(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    let mut plain = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        out.push_str(&raw[plain..i]);
        let c = bytes[i + 1];
        i += 2;
        match c {
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'u' => {
                let hi = hex4(bytes, i).unwrap_or(0xFFFD);
                i += 4;
                let cp = if (0xD800..0xDC00).contains(&hi) {
                    let lo = hex4(bytes, i + 2).unwrap_or(0xDC00);
                    i += 6;
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
            }
            other => out.push(other as char),
        }
        plain = i;
    }
    out.push_str(&raw[plain..]);
    out
}

/// Append `s` to `out` as a JSON string, quotes included.
///
/// Runs of bytes that need no escape are found eight at a time
/// ([`find_special`]) and copied whole.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    let mut i = 0;
    loop {
        i = find_special(bytes, i);
        let Some(&b) = bytes.get(i) else { break };
        if b >= 0x80 {
            // UTF-8 past ASCII is written as it is.
            i += 1;
            while bytes.get(i).is_some_and(|&b| b >= 0x80) {
                i += 1;
            }
            continue;
        }
        out.extend_from_slice(&bytes[plain..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
        }
        i += 1;
        plain = i;
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

/// Validate that `buf` is exactly one JSON value within `limits`.
pub fn validate(buf: &[u8], limits: &Limits) -> Result<(), JsonError> {
    let mut s = Scanner::new(buf, limits)?;
    s.skip_value(0)?;
    s.finish()
}

#[cfg(test)]
mod tests;
