//! Helpers shared by the fuzz targets: a JSON value tree read with the core's
//! [`Scanner`], and its canonical encoding, so a target can check that
//! decode → encode → decode gives the same value; and the cuts of an input
//! into reads, for the stream decoders' split-invariance.

use _core::json::{write_str, JsonError, Kind, Limits, Scanner};

/// A JSON value as the scanner sees it (numbers kept as their text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

/// Read one value at the scanner's position; `depth` is the nesting of the
/// container holding it (0 at top level), as in [`Scanner::skip_value`].
pub fn read_value(s: &mut Scanner<'_>, depth: usize) -> Result<Value, JsonError> {
    let buf = s.buf();
    Ok(match s.peek_kind()? {
        Kind::Object => {
            s.enter(depth)?;
            s.begin_object()?;
            let mut members = Vec::new();
            let mut first = true;
            while let Some(key) = s.next_key(first)? {
                first = false;
                let name = key.as_str(buf).into_owned();
                members.push((name, read_value(s, depth + 1)?));
            }
            Value::Object(members)
        }
        Kind::Array => {
            s.enter(depth)?;
            s.begin_array()?;
            let mut items = Vec::new();
            let mut first = true;
            while s.next_item(first)? {
                first = false;
                items.push(read_value(s, depth + 1)?);
            }
            Value::Array(items)
        }
        Kind::String => Value::String(s.string()?.as_str(buf).into_owned()),
        Kind::Number => {
            let (start, end, _) = s.number()?;
            Value::Number(String::from_utf8_lossy(&buf[start..end]).into_owned())
        }
        kind @ (Kind::True | Kind::False) => {
            s.literal(kind)?;
            Value::Bool(kind == Kind::True)
        }
        Kind::Null => {
            s.literal(Kind::Null)?;
            Value::Null
        }
    })
}

/// Parse a whole document into a [`Value`].
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Value, JsonError> {
    let mut s = Scanner::new(buf, limits)?;
    let value = read_value(&mut s, 0)?;
    s.finish()?;
    Ok(value)
}

/// The canonical encoding of `value`: no whitespace, strings as [`write_str`] writes them.
pub fn encode(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(text) => out.extend_from_slice(text.as_bytes()),
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                encode(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (i, (key, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, key);
                out.push(b':');
                encode(item, out);
            }
            out.push(b'}');
        }
    }
}

/// [`encode`] into a new buffer.
#[must_use]
pub fn to_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(value, &mut out);
    out
}

/// Limits large enough that a re-encoded document (escapes may make it longer) still fits.
#[must_use]
pub fn roomy(limits: &Limits) -> Limits {
    Limits {
        max_bytes: limits.max_bytes.saturating_mul(7),
        max_depth: limits.max_depth,
    }
}

/// The raw JSON at `range` of `buf`, parsed (it was validated by the decoder).
#[must_use]
pub fn raw_value(buf: &[u8], range: (usize, usize), limits: &Limits) -> Value {
    let raw = &buf[range.0..range.1];
    match parse(raw, &roomy(limits)) {
        Ok(value) => value,
        Err(e) => panic!("a raw value the decoder accepted does not parse alone: {e}"),
    }
}

/// FNV-1a of `data`: cut points and bounds a target draws from its input, so
/// that a crash replays from its bytes alone.
#[must_use]
pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Ways to cut `data` into the reads of a stream, each to be decoded and
/// compared with `data` read whole: at one point drawn from `data`, at two
/// points with an empty read between, in reads of a few bytes (at most about
/// `max_pieces` of them), and byte by byte when `data` is at most `bytewise`
/// bytes long.
#[must_use]
pub fn cuts(data: &[u8], max_pieces: usize, bytewise: usize) -> Vec<Vec<&[u8]>> {
    let h = fnv(data);
    let n = data.len();
    let at = |bits: u32| ((h >> bits) as usize) % (n + 1);
    let one = at(0);
    let (a, b) = {
        let (x, y) = (at(21), at(42));
        (x.min(y), x.max(y))
    };
    let small = 1 + (h >> 58) as usize % 31;
    let size = small.max(n.div_ceil(max_pieces.max(1)));
    let mut plans = vec![
        vec![&data[..one], &data[one..]],
        vec![&data[..a], &data[a..a], &data[a..b], &data[b..]],
        data.chunks(size).collect(),
    ];
    if n <= bytewise {
        plans.push(data.chunks(1).collect());
    }
    plans
}
