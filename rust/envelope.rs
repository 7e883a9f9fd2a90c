//! The spec 002 event envelope: decoding to an index of spans over the wire
//! bytes, validation of the header fields, and encoding.
//!
//! An envelope is kept as its wire bytes plus an [`EnvelopeIndex`]; nothing is
//! copied or decoded until asked for, and an envelope that was not changed
//! encodes to the very bytes it came from.

use crate::json::{
    find_special, write_str, JsonError, KeySet, Kind, Limits, Scanner, Span, MAX_INPUT,
};

/// The eight event types of spec 002.
pub const SPEC_TYPES: [&str; 8] = [
    "INPUT:USER_MESSAGE",
    "INPUT:SYSTEM_COMMAND",
    "INPUT:SIGNAL",
    "KERNEL:TICK_START",
    "KERNEL:STATE_CHANGE",
    "KERNEL:ERROR",
    "EXEC:TOOL_CALL",
    "EXEC:TOOL_RESULT",
];

/// How deep the payload sits in an envelope (the envelope's object is level 1).
pub const PAYLOAD_DEPTH: usize = 1;

/// Lowest priority number (served last). Priority 0 is served first.
pub const LOWEST_PRIORITY: u8 = 5;

/// Where each field of a decoded envelope lies in its wire bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeIndex {
    pub id: Span,
    pub timestamp: i64,
    pub trace_id: Span,
    pub source: Span,
    pub session_id: Span,
    pub priority: u8,
    pub type_: Span,
    /// Byte range of the payload's raw JSON (a span that is never escaped).
    pub payload: Span,
    pub parent_id: Option<Span>,
    /// Fields this version does not know: the key and the raw value's byte range.
    pub extra: Vec<(Span, Span)>,
}

const F_ID: u16 = 1;
const F_TIMESTAMP: u16 = 1 << 1;
const F_TRACE: u16 = 1 << 2;
const F_SOURCE: u16 = 1 << 3;
const F_SESSION: u16 = 1 << 4;
const F_PRIORITY: u16 = 1 << 5;
const F_TYPE: u16 = 1 << 6;
const F_PAYLOAD: u16 = 1 << 7;
const F_PARENT: u16 = 1 << 8;
const REQUIRED: [(u16, &str); 8] = [
    (F_ID, "id"),
    (F_TIMESTAMP, "timestamp"),
    (F_TRACE, "traceId"),
    (F_SOURCE, "source"),
    (F_SESSION, "sessionId"),
    (F_PRIORITY, "priority"),
    (F_TYPE, "type"),
    (F_PAYLOAD, "payload"),
];

/// Decode and validate one envelope.
pub fn decode(buf: &[u8], limits: &Limits) -> Result<EnvelopeIndex, JsonError> {
    if let Some(idx) = decode_compact(buf, limits) {
        return Ok(idx);
    }
    decode_general(buf, limits)
}

/// The key literals of a compact envelope in the spec's order, each with the
/// byte before it (`{` or `,`), for [`decode_compact`].
const COMPACT: [KeyLiteral; 9] = [
    KeyLiteral::new(b"{\"id\":", F_ID),
    KeyLiteral::new(b",\"timestamp\":", F_TIMESTAMP),
    KeyLiteral::new(b",\"traceId\":", F_TRACE),
    KeyLiteral::new(b",\"source\":", F_SOURCE),
    KeyLiteral::new(b",\"sessionId\":", F_SESSION),
    KeyLiteral::new(b",\"priority\":", F_PRIORITY),
    KeyLiteral::new(b",\"type\":", F_TYPE),
    KeyLiteral::new(b",\"payload\":", F_PAYLOAD),
    KeyLiteral::new(b",\"parentId\":", F_PARENT),
];

/// The fast path of [`decode`]: a compact envelope (no whitespace outside the
/// payload) with its fields in the spec's order, `parentId` last if present,
/// no other field, and header strings without escapes or non-ASCII bytes, as
/// [`encode`] and most producers write it. Anything else, every invalid
/// envelope included, is `None`, and [`decode_general`] decodes it (and gives
/// the error).
///
/// It checks what [`decode_general`] checks and builds the same index (tested
/// against it below), in one pass with no per-token calls; the payload goes
/// through the scanner's own fast skip.
#[inline]
fn decode_compact(buf: &[u8], limits: &Limits) -> Option<EnvelopeIndex> {
    let s = Scanner::new(buf, limits).ok()?;
    let (idx, end) = compact_prefix::<false>(buf, &s)?;
    (end == buf.len()).then_some(idx)
}

/// The compact envelope (as [`decode_compact`] takes it) that starts `rest`,
/// a line of NDJSON and what follows it, and where it ends (after its closing
/// brace); `None` if there is none, if it holds a newline, or if it is longer
/// than `limits.max_bytes`.
///
/// A line that is exactly that envelope (the next byte ends the line)
/// decodes to the same index by [`decode`]: NDJSON is then split and decoded
/// in one pass. For any other line, split it and [`decode`] it.
#[inline]
#[must_use]
pub fn decode_line_prefix(rest: &[u8], limits: &Limits) -> Option<(EnvelopeIndex, usize)> {
    let unbounded = Limits {
        max_bytes: MAX_INPUT,
        max_depth: limits.max_depth,
    };
    let s = Scanner::new(rest, &unbounded).ok()?;
    let (idx, end) = compact_prefix::<true>(rest, &s)?;
    (end <= limits.max_bytes.min(MAX_INPUT)).then_some((idx, end))
}

/// The compact envelope at the start of `buf` and the index after its
/// closing brace; with `IN_LINE`, none that holds a newline.
#[inline(always)]
fn compact_prefix<const IN_LINE: bool>(
    buf: &[u8],
    s: &Scanner<'_>,
) -> Option<(EnvelopeIndex, usize)> {
    let mut pos = 0;
    let key = |pos: &mut usize, n: usize| -> Option<()> {
        let lit = &COMPACT[n];
        lit.matches(buf, *pos).then(|| *pos += lit.len)
    };
    key(&mut pos, 0)?;
    let id = plain_string(buf, &mut pos)?;
    key(&mut pos, 1)?;
    let timestamp = plain_timestamp(buf, &mut pos)?;
    key(&mut pos, 2)?;
    let trace_id = plain_string(buf, &mut pos)?;
    key(&mut pos, 3)?;
    let source = plain_string(buf, &mut pos)?;
    key(&mut pos, 4)?;
    let session_id = plain_string(buf, &mut pos)?;
    key(&mut pos, 5)?;
    let priority = match buf.get(pos..pos + 2)? {
        &[d @ b'0'..=b'5', b','] => d - b'0',
        _ => return None,
    };
    pos += 1;
    key(&mut pos, 6)?;
    let type_ = plain_string(buf, &mut pos)?;
    if !is_event_type_bytes(type_.raw(buf)) {
        return None;
    }
    key(&mut pos, 7)?;
    let end = s.skip_fast_in::<IN_LINE>(pos, PAYLOAD_DEPTH)?;
    let payload = Span::new(pos, end, false);
    pos = end;
    let parent_id = if key(&mut pos, 8).is_some() {
        Some(plain_string(buf, &mut pos)?)
    } else {
        None
    };
    if buf.get(pos) != Some(&b'}') {
        return None;
    }
    let idx = EnvelopeIndex {
        id,
        timestamp,
        trace_id,
        source,
        session_id,
        priority,
        type_,
        payload,
        parent_id,
        extra: Vec::new(),
    };
    Some((idx, pos + 1))
}

/// For [`decode_compact`]: the non-empty string at `pos` (its opening quote)
/// when it holds only printable ASCII without escapes; `pos` moves past it.
#[inline(always)]
fn plain_string(buf: &[u8], pos: &mut usize) -> Option<Span> {
    if buf.get(*pos) != Some(&b'"') {
        return None;
    }
    let start = *pos + 1;
    let end = find_special(buf, start);
    if end == start || buf.get(end) != Some(&b'"') {
        return None;
    }
    *pos = end + 1;
    Some(Span::new(start, end, false))
}

/// For [`decode_compact`]: the timestamp at `pos`, 1 to 18 digits without a
/// leading zero (or `0`) followed by `,`; `pos` moves to the comma.
#[inline(always)]
fn plain_timestamp(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let start = *pos;
    let mut i = start;
    let mut value = 0i64;
    while let Some(&d @ b'0'..=b'9') = buf.get(i) {
        if i - start == 18 {
            return None;
        }
        value = value * 10 + i64::from(d - b'0');
        i += 1;
    }
    let digits = i - start;
    if digits == 0 || (buf[start] == b'0' && digits > 1) || buf.get(i) != Some(&b',') {
        return None;
    }
    *pos = i;
    Some(value)
}

/// [`decode`] for any layout: whitespace, fields in any order, unknown
/// fields, escapes; and every error.
fn decode_general(buf: &[u8], limits: &Limits) -> Result<EnvelopeIndex, JsonError> {
    let mut s = Scanner::new(buf, limits)?;
    let kind = s.peek_kind()?;
    if kind != Kind::Object {
        return Err(JsonError::at(
            s.pos(),
            format!("an event must be a JSON object, found {}", kind.name()),
        ));
    }
    s.begin_object()?;
    let mut seen: u16 = 0;
    let mut idx = EnvelopeIndex {
        id: Span::default(),
        timestamp: 0,
        trace_id: Span::default(),
        source: Span::default(),
        session_id: Span::default(),
        priority: 0,
        type_: Span::default(),
        payload: Span::default(),
        parent_id: None,
        extra: Vec::new(),
    };
    let mut extra_names = KeySet::default();
    let mut first = true;
    // Envelopes usually carry their fields in the spec's order, so the next key
    // is first tried as a literal; any other order takes the general path.
    let mut canonical = 0;
    while s.object_sep(first)? {
        first = false;
        let (key, flag) = match CANONICAL.get(canonical) {
            Some(lit) if lit.matches(buf, s.pos()) => {
                canonical += 1;
                let start = s.pos();
                s.skip(lit.len);
                (Span::new(start + 1, start + lit.len - 2, false), lit.flag)
            }
            _ => {
                let key = s.key()?;
                let flag = if key.escaped() {
                    field_flag(key.as_str(buf).as_bytes())
                } else {
                    field_flag(key.raw(buf))
                };
                (key, flag)
            }
        };
        if flag == 0 {
            let name = key.as_str(buf);
            if !extra_names.insert(name.clone()) {
                return Err(
                    JsonError::at(key.start() - 1, "duplicate field").in_field(name.into_owned())
                );
            }
            let (a, b) = s.skip_value(1)?;
            idx.extra.push((key, Span::new(a, b, false)));
            continue;
        }
        if seen & flag != 0 {
            return Err(JsonError::at(key.start() - 1, "duplicate field")
                .in_field(key.as_str(buf).into_owned()));
        }
        seen |= flag;
        match flag {
            F_ID => idx.id = nonempty_string(&mut s, "id")?,
            F_TRACE => idx.trace_id = nonempty_string(&mut s, "traceId")?,
            F_SOURCE => idx.source = nonempty_string(&mut s, "source")?,
            F_SESSION => idx.session_id = nonempty_string(&mut s, "sessionId")?,
            F_PARENT => idx.parent_id = Some(nonempty_string(&mut s, "parentId")?),
            F_TYPE => {
                let span = string_field(&mut s, "type")?;
                let valid = if span.escaped() {
                    is_event_type(&span.as_str(buf))
                } else {
                    is_event_type_bytes(span.raw(buf))
                };
                if !valid {
                    let value = span.as_str(buf);
                    return Err(JsonError::at(
                        span.start() - 1,
                        format!("{value:?} is not NAMESPACE:NAME in capitals"),
                    )
                    .in_field("type"));
                }
                idx.type_ = span;
            }
            F_TIMESTAMP => idx.timestamp = timestamp_field(&mut s)?,
            F_PRIORITY => idx.priority = priority_field(&mut s)?,
            _ => {
                let (a, b) = s.skip_value(PAYLOAD_DEPTH)?;
                idx.payload = Span::new(a, b, false);
            }
        }
    }
    s.finish()?;
    for (flag, name) in REQUIRED {
        if seen & flag == 0 {
            return Err(JsonError::field(name, "missing required field"));
        }
    }
    Ok(idx)
}

/// The fields in the order `encode` writes them and the spec lists them, as
/// they start on the wire (`"id":`), packed for a 16-byte masked compare.
const CANONICAL: [KeyLiteral; 9] = [
    KeyLiteral::new(b"\"id\":", F_ID),
    KeyLiteral::new(b"\"timestamp\":", F_TIMESTAMP),
    KeyLiteral::new(b"\"traceId\":", F_TRACE),
    KeyLiteral::new(b"\"source\":", F_SOURCE),
    KeyLiteral::new(b"\"sessionId\":", F_SESSION),
    KeyLiteral::new(b"\"priority\":", F_PRIORITY),
    KeyLiteral::new(b"\"type\":", F_TYPE),
    KeyLiteral::new(b"\"payload\":", F_PAYLOAD),
    KeyLiteral::new(b"\"parentId\":", F_PARENT),
];

#[derive(Clone, Copy)]
struct KeyLiteral {
    value: u128,
    mask: u128,
    len: usize,
    flag: u16,
}

impl KeyLiteral {
    const fn new(lit: &[u8], flag: u16) -> Self {
        assert!(lit.len() <= 16);
        let mut value = 0u128;
        let mut i = 0;
        while i < lit.len() {
            value |= (lit[i] as u128) << (8 * i);
            i += 1;
        }
        let mask = if lit.len() == 16 {
            u128::MAX
        } else {
            (1u128 << (8 * lit.len())) - 1
        };
        KeyLiteral {
            value,
            mask,
            len: lit.len(),
            flag,
        }
    }

    /// Whether `buf` continues with this literal at `pos` (false too when fewer than 16 bytes remain).
    #[inline(always)]
    fn matches(&self, buf: &[u8], pos: usize) -> bool {
        match buf.get(pos..pos + 16) {
            Some(chunk) => {
                let mut w = [0u8; 16];
                w.copy_from_slice(chunk);
                u128::from_le_bytes(w) & self.mask == self.value
            }
            None => false,
        }
    }
}

#[inline]
fn field_flag(name: &[u8]) -> u16 {
    match name {
        b"id" => F_ID,
        b"timestamp" => F_TIMESTAMP,
        b"traceId" => F_TRACE,
        b"source" => F_SOURCE,
        b"sessionId" => F_SESSION,
        b"priority" => F_PRIORITY,
        b"type" => F_TYPE,
        b"payload" => F_PAYLOAD,
        b"parentId" => F_PARENT,
        _ => 0,
    }
}

#[cold]
fn type_error(s: &mut Scanner<'_>, field: &str, expected: &str) -> JsonError {
    let found = s.peek_kind().map_or("invalid JSON", Kind::name);
    JsonError::at(s.pos(), format!("expected {expected}, found {found}")).in_field(field)
}

#[inline(always)]
fn string_field(s: &mut Scanner<'_>, field: &str) -> Result<Span, JsonError> {
    s.skip_ws();
    if s.buf().get(s.pos()) != Some(&b'"') {
        // Not a string: the scanner's own error when it is no value at all.
        s.peek_kind()?;
        return Err(type_error(s, field, "a string"));
    }
    s.string()
}

#[inline]
fn nonempty_string(s: &mut Scanner<'_>, field: &str) -> Result<Span, JsonError> {
    s.skip_ws();
    let at = s.pos();
    let span = string_field(s, field)?;
    if span.is_empty() {
        return Err(JsonError::at(at, "must be a non-empty string").in_field(field));
    }
    Ok(span)
}

#[inline]
fn timestamp_field(s: &mut Scanner<'_>) -> Result<i64, JsonError> {
    if s.peek_kind()? != Kind::Number {
        return Err(type_error(s, "timestamp", "an integer (Unix time in ms)"));
    }
    let (start, end, integer) = s.number()?;
    let digits = &s.buf()[start..end];
    // An integer without a sign is all digits (the scanner checked), and 18
    // of them always fit: read them directly, without a UTF-8 check and a parse.
    if integer && digits.len() <= 18 && digits[0] != b'-' {
        return Ok(digits
            .iter()
            .fold(0i64, |v, &d| v * 10 + i64::from(d - b'0')));
    }
    let text = std::str::from_utf8(digits).unwrap_or_default();
    let value = if integer {
        text.parse::<i64>().ok()
    } else {
        None
    };
    match value {
        Some(v) if v >= 0 => Ok(v),
        _ => Err(JsonError::at(
            start,
            format!("expected a non-negative integer (Unix time in ms), found {text}"),
        )
        .in_field("timestamp")),
    }
}

#[inline]
fn priority_field(s: &mut Scanner<'_>) -> Result<u8, JsonError> {
    if s.peek_kind()? != Kind::Number {
        return Err(type_error(s, "priority", "an integer 0..5"));
    }
    let (start, end, integer) = s.number()?;
    let text = &s.buf()[start..end];
    match text {
        [d @ b'0'..=b'5'] if integer => Ok(d - b'0'),
        _ => Err(JsonError::at(
            start,
            format!(
                "expected an integer 0..5, found {}",
                String::from_utf8_lossy(text)
            ),
        )
        .in_field("priority")),
    }
}

/// Whether `t` is `NAMESPACE:NAME`: capitals, digits and `_`, each part starting with a capital.
#[must_use]
pub fn is_event_type(t: &str) -> bool {
    is_event_type_bytes(t.as_bytes())
}

/// [`is_event_type`] over bytes, in one pass.
#[inline]
#[must_use]
pub fn is_event_type_bytes(t: &[u8]) -> bool {
    // The spec's own types, compared whole, before the general check.
    if matches!(
        t,
        b"INPUT:USER_MESSAGE"
            | b"INPUT:SYSTEM_COMMAND"
            | b"INPUT:SIGNAL"
            | b"KERNEL:TICK_START"
            | b"KERNEL:STATE_CHANGE"
            | b"KERNEL:ERROR"
            | b"EXEC:TOOL_CALL"
            | b"EXEC:TOOL_RESULT"
    ) {
        return true;
    }
    let mut colons = 0;
    let mut part_start = true;
    for &c in t {
        if c == b':' {
            if part_start {
                return false;
            }
            colons += 1;
            part_start = true;
        } else if part_start {
            if !c.is_ascii_uppercase() {
                return false;
            }
            part_start = false;
        } else if !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_') {
            return false;
        }
    }
    colons == 1 && !part_start
}

/// Validate a priority given as a number.
pub fn check_priority(p: i64) -> Result<u8, JsonError> {
    if (0..=i64::from(LOWEST_PRIORITY)).contains(&p) {
        Ok(p as u8)
    } else {
        Err(JsonError::field(
            "priority",
            format!("expected an integer 0..5, found {p}"),
        ))
    }
}

/// The header fields of an envelope to encode.
#[derive(Debug, Clone, Copy)]
pub struct Header<'a> {
    pub id: &'a str,
    pub timestamp: i64,
    pub trace_id: &'a str,
    pub source: &'a str,
    pub session_id: &'a str,
    pub priority: u8,
    pub type_: &'a str,
    pub parent_id: Option<&'a str>,
}

impl Header<'_> {
    /// Check the header as the decoder would.
    pub fn validate(&self) -> Result<(), JsonError> {
        for (value, field) in [
            (self.id, "id"),
            (self.trace_id, "traceId"),
            (self.source, "source"),
            (self.session_id, "sessionId"),
        ] {
            if value.is_empty() {
                return Err(JsonError::field(field, "must be a non-empty string"));
            }
        }
        if self.parent_id == Some("") {
            return Err(JsonError::field("parentId", "must be a non-empty string"));
        }
        if self.timestamp < 0 {
            return Err(JsonError::field(
                "timestamp",
                "expected a non-negative integer (Unix time in ms)",
            ));
        }
        check_priority(i64::from(self.priority))?;
        if !is_event_type(self.type_) {
            return Err(JsonError::field(
                "type",
                format!("{:?} is not NAMESPACE:NAME in capitals", self.type_),
            ));
        }
        Ok(())
    }
}

/// Encode an envelope: the header, the payload's raw JSON, then `extra` fields
/// (key and raw JSON value). The caller guarantees `payload` and the extra
/// values are valid JSON.
#[must_use]
pub fn encode(h: &Header<'_>, payload: &[u8], extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_size(h, payload.len()));
    let written: Result<_, std::convert::Infallible> = write_fields(&mut out, h, |out| {
        out.extend_from_slice(payload);
        Ok(())
    });
    let Ok(_) = written;
    for (key, value) in extra {
        out.push(b',');
        write_str(&mut out, key);
        out.push(b':');
        out.extend_from_slice(value);
    }
    out.push(b'}');
    out
}

/// [`encode`] with no extra fields, and the index of the bytes it wrote: what
/// [`decode`] would give for them, without decoding them again. The caller
/// guarantees the header is valid ([`Header::validate`]) and `payload` is
/// valid JSON.
#[must_use]
pub fn encode_indexed(h: &Header<'_>, payload: &[u8]) -> (Vec<u8>, EnvelopeIndex) {
    let written: Result<_, std::convert::Infallible> =
        encode_indexed_with(h, payload.len(), |out| {
            out.extend_from_slice(payload);
            Ok(())
        });
    let Ok(encoded) = written;
    encoded
}

/// [`encode_indexed`] with the payload's JSON written in place by
/// `write_payload` (about `payload_len` bytes): no buffer of its own to copy.
///
/// # Errors
///
/// What `write_payload` returns.
pub fn encode_indexed_with<E>(
    h: &Header<'_>,
    payload_len: usize,
    write_payload: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(Vec<u8>, EnvelopeIndex), E> {
    let mut out = Vec::with_capacity(encoded_size(h, payload_len));
    let idx = write_fields(&mut out, h, write_payload)?;
    out.push(b'}');
    Ok((out, idx))
}

fn encoded_size(h: &Header<'_>, payload_len: usize) -> usize {
    160 + payload_len + h.id.len() + h.trace_id.len() + h.source.len() + h.session_id.len()
}

/// Write the header and the payload, in the spec's order, without the closing brace.
fn write_fields<E>(
    out: &mut Vec<u8>,
    h: &Header<'_>,
    write_payload: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<EnvelopeIndex, E> {
    out.extend_from_slice(b"{\"id\":");
    let id = put_str(out, h.id);
    out.extend_from_slice(b",\"timestamp\":");
    out.extend_from_slice(itoa::Buffer::new().format(h.timestamp).as_bytes());
    out.extend_from_slice(b",\"traceId\":");
    let trace_id = put_str(out, h.trace_id);
    out.extend_from_slice(b",\"source\":");
    let source = put_str(out, h.source);
    out.extend_from_slice(b",\"sessionId\":");
    let session_id = put_str(out, h.session_id);
    out.extend_from_slice(b",\"priority\":");
    out.push(b'0' + h.priority);
    out.extend_from_slice(b",\"type\":");
    let type_ = put_str(out, h.type_);
    out.extend_from_slice(b",\"payload\":");
    let start = out.len();
    write_payload(out)?;
    let payload = Span::new(start, out.len(), false);
    let parent_id = h.parent_id.map(|parent| {
        out.extend_from_slice(b",\"parentId\":");
        put_str(out, parent)
    });
    Ok(EnvelopeIndex {
        id,
        timestamp: h.timestamp,
        trace_id,
        source,
        session_id,
        priority: h.priority,
        type_,
        payload,
        parent_id,
        extra: Vec::new(),
    })
}

/// [`write_str`], and the span of the string between its quotes (escaped when
/// the writing escaped anything, as the decoder marks it).
fn put_str(out: &mut Vec<u8>, s: &str) -> Span {
    let start = out.len() + 1;
    write_str(out, s);
    let end = out.len() - 1;
    Span::new(start, end, end - start != s.len())
}

/// A fresh UUID v4 as its canonical hyphenated lowercase string.
#[must_use]
pub fn new_uuid() -> String {
    new_uuid_in(&mut [0; 36]).to_owned()
}

/// A fresh UUID v4, written in `buf`: [`new_uuid`] without an allocation.
pub fn new_uuid_in(buf: &mut [u8; 36]) -> &str {
    #[cfg(unix)]
    reseed_after_fork();
    uuid::Uuid::new_v4().hyphenated().encode_lower(buf)
}

/// A fresh UUID v4 as its 128-bit value (what the dedup window keys it by).
#[must_use]
pub fn new_uuid_value() -> u128 {
    #[cfg(unix)]
    reseed_after_fork();
    uuid::Uuid::new_v4().as_u128()
}

/// The canonical hyphenated lowercase text of the UUID of value `value`, written in `buf`.
pub fn uuid_text(value: u128, buf: &mut [u8; 36]) -> &str {
    uuid::Uuid::from_u128(value).hyphenated().encode_lower(buf)
}

/// Have a forked child reseed the generator ids come from, once ids are made.
///
/// Ids come from the thread's `rand::rng()` (seeded from the OS), which a
/// fork copies: without a reseed the child would make the parent's next ids,
/// and a bus shared by both (Redis) would drop one's events as duplicates of
/// the other's. The child of a fork has one thread, the one that forked,
/// whose generator is reseeded before anything runs in it.
#[cfg(unix)]
fn reseed_after_fork() {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        extern "C" fn reseed_in_child() {
            // A failure (no OS randomness, which would panic making a first
            // generator) leaves the generator as it was: nothing better can be
            // done in a fork handler, and a panic must not cross into C.
            let _ = std::panic::catch_unwind(|| rand::rng().reseed());
        }
        // SAFETY: the handler only reseeds the calling thread's generator,
        // which nothing else is using in a child that has just been forked.
        #[allow(unsafe_code)]
        unsafe {
            libc::pthread_atfork(None, None, Some(reseed_in_child));
        }
    });
}

/// The current Unix time in milliseconds.
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests;
