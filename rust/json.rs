//! A validating JSON scanner over bytes, with limits on depth, and the error type
//! shared by every decoder of the core.

use std::fmt;

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

/// A validating cursor over one JSON document.
///
/// The input is checked to be UTF-8 once, up front; strings are then scanned
/// for escapes and control characters, numbers against the JSON grammar, and
/// nesting is bounded by `max_depth`.
pub struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
    max_depth: usize,
}

impl<'a> Scanner<'a> {
    /// A scanner over `buf`, after checking its size and that it does not start
    /// with a byte order mark. UTF-8 is checked as strings are scanned (outside
    /// strings, any byte that is not ASCII is an error anyway).
    pub fn new(buf: &'a [u8], limits: &Limits) -> Result<Self, JsonError> {
        let max_bytes = limits.max_bytes.min(MAX_INPUT);
        if buf.len() > max_bytes {
            return Err(JsonError::at(
                max_bytes,
                format!(
                    "input of {} bytes exceeds the limit of {max_bytes} bytes",
                    buf.len()
                ),
            ));
        }
        if buf.starts_with(b"\xEF\xBB\xBF") {
            return Err(JsonError::at(0, "a byte order mark is not allowed"));
        }
        Ok(Scanner {
            buf,
            pos: 0,
            max_depth: limits.max_depth.min(MAX_DEPTH),
        })
    }

    #[must_use]
    pub fn buf(&self) -> &'a [u8] {
        self.buf
    }

    #[must_use]
    pub fn pos(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while let Some(&b) = self.buf.get(self.pos) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// After the document: only whitespace may follow.
    pub fn finish(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(JsonError::at(
                self.pos,
                "unexpected data after the JSON value",
            ))
        }
    }

    fn eof(&self, what: &str) -> JsonError {
        JsonError::at(
            self.pos,
            format!("unexpected end of input, expected {what}"),
        )
    }

    /// Skip whitespace and tell what kind of value starts here.
    #[inline(always)]
    pub fn peek_kind(&mut self) -> Result<Kind, JsonError> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            None => Err(self.eof("a value")),
            Some(b'{') => Ok(Kind::Object),
            Some(b'[') => Ok(Kind::Array),
            Some(b'"') => Ok(Kind::String),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b't') => Ok(Kind::True),
            Some(b'f') => Ok(Kind::False),
            Some(b'n') => Ok(Kind::Null),
            Some(&b) => Err(JsonError::at(
                self.pos,
                format!("unexpected character {}", show_byte(b)),
            )),
        }
    }

    /// Consume `byte` (after whitespace) or fail.
    #[inline(always)]
    pub fn expect(&mut self, byte: u8) -> Result<(), JsonError> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(&b) if b == byte => {
                self.pos += 1;
                Ok(())
            }
            Some(&b) => Err(JsonError::at(
                self.pos,
                format!("expected '{}', found {}", byte as char, show_byte(b)),
            )),
            None => Err(self.eof(&format!("'{}'", byte as char))),
        }
    }

    /// Start an object: consume `{`. Then call [`Scanner::next_key`] until it returns `None`.
    #[inline]
    pub fn begin_object(&mut self) -> Result<(), JsonError> {
        self.expect(b'{')
    }

    /// The next key of an object (consuming the `:` after it), or `None` at `}`.
    /// `first` is true for the first call after [`Scanner::begin_object`].
    #[inline(always)]
    pub fn next_key(&mut self, first: bool) -> Result<Option<Span>, JsonError> {
        if self.object_sep(first)? {
            self.key().map(Some)
        } else {
            Ok(None)
        }
    }

    /// Between object members: consume `}` (returns false) or, after the first
    /// member, the `,` before the next key (returns true).
    #[inline(always)]
    pub fn object_sep(&mut self, first: bool) -> Result<bool, JsonError> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(b'}') => {
                self.pos += 1;
                return Ok(false);
            }
            Some(b',') if !first => {
                self.pos += 1;
                self.skip_ws();
            }
            Some(&b) if !first => {
                return Err(JsonError::at(
                    self.pos,
                    format!("expected ',' or '}}', found {}", show_byte(b)),
                ));
            }
            None => return Err(self.eof("an object key or '}'")),
            _ => {}
        }
        Ok(true)
    }

    /// An object key and the `:` after it.
    #[inline(always)]
    pub fn key(&mut self) -> Result<Span, JsonError> {
        match self.buf.get(self.pos) {
            Some(b'"') => {}
            Some(&b) => {
                return Err(JsonError::at(
                    self.pos,
                    format!("expected an object key, found {}", show_byte(b)),
                ));
            }
            None => return Err(self.eof("an object key")),
        }
        let key = self.string()?;
        self.expect(b':')?;
        Ok(key)
    }

    /// Move past `n` bytes the caller has checked.
    #[inline(always)]
    pub fn skip(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
    }

    /// Start an array: consume `[`. Then call [`Scanner::next_item`] until it returns false.
    #[inline]
    pub fn begin_array(&mut self) -> Result<(), JsonError> {
        self.expect(b'[')
    }

    /// Whether another array item follows (consuming the `,` before it).
    #[inline]
    pub fn next_item(&mut self, first: bool) -> Result<bool, JsonError> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(b']') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b',') if !first => {
                self.pos += 1;
                Ok(true)
            }
            Some(&b) if !first => Err(JsonError::at(
                self.pos,
                format!("expected ',' or ']', found {}", show_byte(b)),
            )),
            None => Err(self.eof("a value or ']'")),
            _ => Ok(true),
        }
    }

    /// Scan a string (the cursor is at its opening quote); returns its contents' span.
    #[inline(always)]
    pub fn string(&mut self) -> Result<Span, JsonError> {
        self.skip_ws();
        if self.buf.get(self.pos) != Some(&b'"') {
            return Err(match self.buf.get(self.pos) {
                Some(&b) => JsonError::at(
                    self.pos,
                    format!("expected a string, found {}", show_byte(b)),
                ),
                None => self.eof("a string"),
            });
        }
        let start = self.pos + 1;
        let mut i = start;
        let mut escaped = false;
        let buf = self.buf;
        loop {
            i = find_special(buf, i);
            match buf.get(i) {
                None => {
                    self.pos = i;
                    return Err(JsonError::at(start - 1, "unterminated string"));
                }
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(Span::new(start, i, escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    i = self.escape(i)?;
                }
                Some(&b) if b >= 0x80 => i = utf8_char(buf, i)?,
                Some(&b) => {
                    return Err(JsonError::at(
                        i,
                        format!(
                            "control character {} must be escaped in a string",
                            show_byte(b)
                        ),
                    ));
                }
            }
        }
    }

    /// Validate the escape at `i` (a backslash); returns the index after it.
    #[inline]
    fn escape(&self, i: usize) -> Result<usize, JsonError> {
        let buf = self.buf;
        match buf.get(i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
            Some(b'u') => {
                let cp = hex4(buf, i + 2).ok_or_else(|| JsonError::at(i, "invalid \\u escape"))?;
                if (0xDC00..0xE000).contains(&cp) {
                    return Err(JsonError::at(i, "lone low surrogate in \\u escape"));
                }
                if (0xD800..0xDC00).contains(&cp) {
                    let low = if buf.get(i + 6) == Some(&b'\\') && buf.get(i + 7) == Some(&b'u') {
                        hex4(buf, i + 8)
                    } else {
                        None
                    };
                    match low {
                        Some(lo) if (0xDC00..0xE000).contains(&lo) => Ok(i + 12),
                        _ => Err(JsonError::at(i, "lone high surrogate in \\u escape")),
                    }
                } else {
                    Ok(i + 6)
                }
            }
            Some(_) => Err(JsonError::at(i, "invalid escape in string")),
            None => Err(JsonError::at(i, "unterminated string")),
        }
    }

    /// Scan a number; returns its byte range and whether it is an integer
    /// (no fraction, no exponent).
    #[inline(always)]
    pub fn number(&mut self) -> Result<(usize, usize, bool), JsonError> {
        self.skip_ws();
        let buf = self.buf;
        let start = self.pos;
        let mut i = start;
        if buf.get(i) == Some(&b'-') {
            i += 1;
        }
        match buf.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(buf.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => return Err(JsonError::at(start, "invalid number")),
        }
        let mut integer = true;
        let mut exponent = false;
        if buf.get(i) == Some(&b'.') {
            integer = false;
            i += 1;
            if !matches!(buf.get(i), Some(b'0'..=b'9')) {
                return Err(JsonError::at(
                    start,
                    "invalid number: digits expected after '.'",
                ));
            }
            while matches!(buf.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        if matches!(buf.get(i), Some(b'e' | b'E')) {
            integer = false;
            exponent = true;
            i += 1;
            if matches!(buf.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !matches!(buf.get(i), Some(b'0'..=b'9')) {
                return Err(JsonError::at(
                    start,
                    "invalid number: digits expected in the exponent",
                ));
            }
            while matches!(buf.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        if matches!(buf.get(i), Some(b'0'..=b'9')) {
            return Err(JsonError::at(start, "invalid number: leading zero"));
        }
        // Python refuses to convert integers of more than 4300 digits: refuse
        // them here, not when the payload is first read.
        if integer && i - start > MAX_INT_DIGITS {
            return Err(JsonError::at(
                start,
                format!("integer of more than {MAX_INT_DIGITS} digits"),
            ));
        }
        // A float beyond f64 would read as inf, which JSON cannot write back:
        // refuse it, as the literals Infinity and NaN are refused. Only an
        // exponent or some 309 digits can overflow, so only those are parsed.
        if !integer && (exponent || i - start > 300) {
            let finite = std::str::from_utf8(&buf[start..i])
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .is_some_and(f64::is_finite);
            if !finite {
                return Err(JsonError::at(
                    start,
                    "number out of range (beyond a 64-bit float)",
                ));
            }
        }
        self.pos = i;
        Ok((start, i, integer))
    }

    /// Consume the literal `true`, `false` or `null` that starts here.
    #[inline]
    pub fn literal(&mut self, kind: Kind) -> Result<(), JsonError> {
        self.skip_ws();
        let word: &[u8] = match kind {
            Kind::True => b"true",
            Kind::False => b"false",
            _ => b"null",
        };
        if self.buf[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(JsonError::at(self.pos, "invalid literal"))
        }
    }

    /// Validate and skip one value; returns its byte range. `depth` is the
    /// nesting depth of the container holding the value (0 at top level).
    ///
    /// One tight pass over the bytes ([`Scanner::skip_fast`]) takes every
    /// value it can prove valid; anything else (every invalid value, and the
    /// rare valid ones it leaves alone: exponents, long numbers, nesting past
    /// 64 levels) is scanned again from its start by
    /// [`Scanner::skip_value_checked`], which gives the error. The two accept
    /// exactly the same values with the same ranges (tested against each
    /// other below), so errors are the checked scanner's, byte for byte.
    #[inline]
    pub fn skip_value(&mut self, depth: usize) -> Result<(usize, usize), JsonError> {
        self.skip_ws();
        let start = self.pos;
        if let Some(end) = self.skip_fast(start, depth) {
            self.pos = end;
            return Ok((start, end));
        }
        self.skip_value_checked(depth)
    }

    /// The fast path of [`Scanner::skip_value`]: the end of the value that
    /// starts at `start`, or `None` for anything it does not take (including
    /// every error). It only reads; the cursor does not move.
    ///
    /// Strings go through the same word-at-a-time search and the same escape
    /// and UTF-8 checks as [`Scanner::string`]; structure is one loop over
    /// the bytes with the open containers in a 64-bit stack, instead of a call
    /// per token each skipping whitespace and building a `Result`.
    pub(crate) fn skip_fast(&self, start: usize, depth: usize) -> Option<usize> {
        self.skip_fast_in::<false>(start, depth)
    }

    /// [`Scanner::skip_fast`] that also leaves (`None`) any value with a
    /// newline in it, when `IN_LINE`: for a value read out of NDJSON before
    /// the line's end is known, where a newline ends the line.
    #[inline(always)]
    pub(crate) fn skip_fast_in<const IN_LINE: bool>(
        &self,
        start: usize,
        depth: usize,
    ) -> Option<usize> {
        let buf = self.buf;
        let mut i = start;
        // Bit n is set when the container open at level n is an object.
        let mut objects = 0u64;
        let mut level = 0usize;
        'value: loop {
            // A value starts at `i`, whitespace skipped.
            match *buf.get(i)? {
                b'"' => i = self.string_end(i + 1)?,
                open @ (b'{' | b'[') => {
                    if level >= 64 || depth + level >= self.max_depth {
                        return None;
                    }
                    i = skip_ws_at::<IN_LINE>(buf, i + 1);
                    let object = open == b'{';
                    let close = if object { b'}' } else { b']' };
                    if buf.get(i) == Some(&close) {
                        i += 1;
                    } else {
                        if object {
                            objects |= 1 << level;
                            i = self.member_key::<IN_LINE>(i)?;
                        } else {
                            objects &= !(1 << level);
                        }
                        level += 1;
                        continue 'value;
                    }
                }
                b't' => i = literal_end(buf, i, b"true")?,
                b'f' => i = literal_end(buf, i, b"false")?,
                b'n' => i = literal_end(buf, i, b"null")?,
                _ => i = number_end(buf, i)?,
            }
            // A value ended at `i`: close the containers it ends.
            loop {
                if level == 0 {
                    return Some(i);
                }
                i = skip_ws_at::<IN_LINE>(buf, i);
                let object = objects & (1 << (level - 1)) != 0;
                match *buf.get(i)? {
                    b',' => {
                        i = skip_ws_at::<IN_LINE>(buf, i + 1);
                        if object {
                            i = self.member_key::<IN_LINE>(i)?;
                        }
                        continue 'value;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                i += 1;
                level -= 1;
            }
        }
    }

    /// For [`Scanner::skip_fast`]: the key at `i`, its `:` and the whitespace
    /// around it; returns where the member's value starts.
    #[inline(always)]
    fn member_key<const IN_LINE: bool>(&self, i: usize) -> Option<usize> {
        let buf = self.buf;
        if buf.get(i) != Some(&b'"') {
            return None;
        }
        let i = skip_ws_at::<IN_LINE>(buf, self.string_end(i + 1)?);
        if buf.get(i) != Some(&b':') {
            return None;
        }
        Some(skip_ws_at::<IN_LINE>(buf, i + 1))
    }

    /// For [`Scanner::skip_fast`]: the index after the closing quote of the
    /// string whose contents start at `i`, validated as [`Scanner::string`]
    /// validates them; `None` where that would fail.
    #[inline(always)]
    fn string_end(&self, mut i: usize) -> Option<usize> {
        let buf = self.buf;
        loop {
            i = find_special(buf, i);
            match *buf.get(i)? {
                b'"' => return Some(i + 1),
                b'\\' => i = self.escape(i).ok()?,
                b if b >= 0x80 => i = utf8_char(buf, i).ok()?,
                _ => return None,
            }
        }
    }

    /// The validating scanner behind [`Scanner::skip_value`]: one call per
    /// token, and the error of any invalid value.
    ///
    /// Iterative, with the open containers kept in a bit stack: the machine
    /// stack does not grow with the nesting, whatever the limit.
    pub fn skip_value_checked(&mut self, depth: usize) -> Result<(usize, usize), JsonError> {
        self.skip_ws();
        let start = self.pos;
        // Bit n of `objects` is set when the container open at level n is an object.
        let mut objects = [0u64; MAX_DEPTH.div_ceil(64)];
        let mut level = 0usize;
        loop {
            // A value starts here.
            let kind = self.peek_kind()?;
            let opened = match kind {
                Kind::Object => {
                    self.enter(depth + level)?;
                    self.begin_object()?;
                    self.object_sep(true)? && {
                        self.key()?;
                        true
                    }
                }
                Kind::Array => {
                    self.enter(depth + level)?;
                    self.begin_array()?;
                    self.next_item(true)?
                }
                Kind::String => {
                    self.string()?;
                    false
                }
                Kind::Number => {
                    self.number()?;
                    false
                }
                Kind::True | Kind::False | Kind::Null => {
                    self.literal(kind)?;
                    false
                }
            };
            if opened {
                // A non-empty container: its first value is next.
                let bit = 1u64 << (level % 64);
                if kind == Kind::Object {
                    objects[level / 64] |= bit;
                } else {
                    objects[level / 64] &= !bit;
                }
                level += 1;
                continue;
            }
            // A value ended (a scalar or an empty container): close what it ends.
            loop {
                if level == 0 {
                    return Ok((start, self.pos));
                }
                let top = level - 1;
                let more = if objects[top / 64] & (1u64 << (top % 64)) != 0 {
                    self.object_sep(false)? && {
                        self.key()?;
                        true
                    }
                } else {
                    self.next_item(false)?
                };
                if more {
                    break;
                }
                level -= 1;
            }
        }
    }

    /// Check that opening one more container at `depth` stays within the limit.
    pub fn enter(&self, depth: usize) -> Result<(), JsonError> {
        if depth >= self.max_depth {
            Err(JsonError::at(
                self.pos,
                format!("nesting deeper than {} levels", self.max_depth),
            ))
        } else {
            Ok(())
        }
    }
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
///
/// With `IN_LINE`, a newline is not skipped (it ends an NDJSON line).
#[inline(always)]
fn skip_ws_at<const IN_LINE: bool>(buf: &[u8], mut i: usize) -> usize {
    while let Some(&b @ (b' ' | b'\t' | b'\n' | b'\r')) = buf.get(i) {
        if IN_LINE && b == b'\n' {
            break;
        }
        i += 1;
    }
    i
}

/// For [`Scanner::skip_fast`]: the index after `word` (`true`, `false` or
/// `null`) at `i`, or `None`.
#[inline(always)]
fn literal_end(buf: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (buf.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// For [`Scanner::skip_fast`]: the index after the number at `i`, or `None`
/// when there is none or [`Scanner::number`] would have more to check: an
/// exponent (the range check) or more than 300 bytes (the digit limits).
#[inline(always)]
fn number_end(buf: &[u8], start: usize) -> Option<usize> {
    let digit = |i: usize| matches!(buf.get(i), Some(b'0'..=b'9'));
    let mut i = start;
    if buf.get(i) == Some(&b'-') {
        i += 1;
    }
    match buf.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => {
            i += 1;
            while digit(i) {
                i += 1;
            }
        }
        _ => return None,
    }
    if buf.get(i) == Some(&b'.') {
        i += 1;
        if !digit(i) {
            return None;
        }
        while digit(i) {
            i += 1;
        }
    }
    // An exponent, or a digit after a leading zero.
    if matches!(buf.get(i), Some(b'e' | b'E' | b'0'..=b'9')) || i - start > 300 {
        return None;
    }
    Some(i)
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

/// Check the UTF-8 sequence that starts at `i` (a byte >= 0x80); returns the index after it.
#[cold]
fn utf8_char(buf: &[u8], i: usize) -> Result<usize, JsonError> {
    let width = match buf[i] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 0,
    };
    match buf.get(i..i + width) {
        Some(seq) if width > 0 && std::str::from_utf8(seq).is_ok() => Ok(i + width),
        _ => Err(JsonError::at(i, "invalid UTF-8")),
    }
}

fn hex4(buf: &[u8], i: usize) -> Option<u32> {
    let digits = buf.get(i..i + 4)?;
    let mut v = 0u32;
    for &d in digits {
        v = v * 16 + (d as char).to_digit(16)?;
    }
    Some(v)
}

fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
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
mod tests {
    use super::*;

    fn ok(s: &str) -> bool {
        validate(s.as_bytes(), &Limits::default()).is_ok()
    }

    #[test]
    fn accepts_valid_documents() {
        for s in [
            "{}",
            "[]",
            "0",
            "-0",
            "1.5e10",
            "-1E-2",
            "\"\"",
            "true",
            "false",
            "null",
            " {\"a\": [1, 2, {\"b\": null}], \"c\": \"\\u00e9\\ud83d\\ude00\\n\"} ",
            "\"caf\u{e9}\"",
        ] {
            assert!(ok(s), "{s}");
        }
    }

    #[test]
    fn rejects_invalid_documents() {
        for s in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "1e",
            "-",
            "+1",
            "tru",
            "nul",
            "NaN",
            "Infinity",
            "\"abc",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"a\u{1}b\"",
            "{1:2}",
            "{\"a\" 1}",
            "[1 2]",
            "1 2",
            "{}x",
        ] {
            assert!(!ok(s), "{s:?} should be rejected");
        }
    }

    #[test]
    fn rejects_bom_and_bad_utf8_with_offsets() {
        let e = validate(b"\xEF\xBB\xBF{}", &Limits::default()).unwrap_err();
        assert_eq!(e.offset, Some(0));
        let e = validate(b"{\"a\":\"\xff\"}", &Limits::default()).unwrap_err();
        assert_eq!(e.offset, Some(6));
    }

    #[test]
    fn bounds_depth_and_size() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let e = validate(
            deep.as_bytes(),
            &Limits {
                max_bytes: 1 << 30,
                max_depth: 64,
            },
        )
        .unwrap_err();
        assert!(e.message.contains("nesting"), "{e}");
        let ok64 = "[".repeat(64) + &"]".repeat(64);
        assert!(validate(ok64.as_bytes(), &Limits::default()).is_ok());
        let too = "[".repeat(65) + &"]".repeat(65);
        assert!(validate(too.as_bytes(), &Limits::default()).is_err());
        let e = validate(
            b"[1, 2, 3]",
            &Limits {
                max_bytes: 4,
                max_depth: 64,
            },
        )
        .unwrap_err();
        assert!(e.message.contains("exceeds"), "{e}");
    }

    #[test]
    fn integers_are_bounded_like_python_ints() {
        assert!(
            !ok("1e400"),
            "beyond f64: it could not be written back as JSON"
        );
        assert!(ok(&format!("{}.5", "9".repeat(300))));
        assert!(!ok(&format!("{}.5", "9".repeat(400))));
        assert!(ok(&"9".repeat(MAX_INT_DIGITS)));
        assert!(!ok(&"9".repeat(MAX_INT_DIGITS + 1)));
    }

    #[test]
    fn skipping_is_iterative_and_exact() {
        let limits = Limits {
            max_bytes: usize::MAX,
            max_depth: MAX_DEPTH,
        };
        let deep = "[{\"a\":".repeat(255) + "1" + &"}]".repeat(255);
        assert!(validate(deep.as_bytes(), &limits).is_ok());
        let mut s = Scanner::new(b"[1,{\"a\":[]},{}] 7", &limits).unwrap();
        assert_eq!(s.skip_value(0).unwrap(), (0, 15));
        for bad in [
            "[1,]",
            "{\"a\":1,}",
            "[{]",
            "{\"a\" []}",
            "[1 2]",
            "[[]",
            "{\"a\":{}",
        ] {
            assert!(validate(bad.as_bytes(), &limits).is_err(), "{bad}");
        }
    }

    /// A small xorshift generator: the property tests below are reproducible.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    /// `write_str` as it was first written, one byte at a time: the reference.
    fn write_str_bytewise(out: &mut Vec<u8>, s: &str) {
        out.push(b'"');
        for &b in s.as_bytes() {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                _ => out.push(b),
            }
        }
        out.push(b'"');
    }

    #[test]
    fn write_str_escapes_as_a_byte_at_a_time_would_and_reads_back() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let pieces = [
            "a",
            "bcdefghij",
            "\"",
            "\\",
            "\n",
            "\r",
            "\t",
            "\u{8}",
            "\u{c}",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "é",
            "東京",
            "😀",
            " ",
            "0123456789abcdef",
        ];
        for _ in 0..20_000 {
            let n = rng.below(12);
            let s: String = (0..n).map(|_| rng.pick(&pieces)).collect();
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            write_str(&mut fast, &s);
            write_str_bytewise(&mut slow, &s);
            assert_eq!(fast, slow, "{s:?}");
            let inner = std::str::from_utf8(&fast[1..fast.len() - 1]).unwrap();
            assert_eq!(unescape(inner), s);
        }
    }

    /// A random JSON value, valid or nearly so: every construct the scanners
    /// know, with whitespace, escapes, UTF-8 and numbers of every shape.
    fn random_value(rng: &mut Rng, out: &mut String, depth: usize) {
        const WS: [&str; 5] = ["", "", "", " ", "\n\t "];
        const NUMBERS: [&str; 16] = [
            "0",
            "-0",
            "7",
            "-12",
            "1.5",
            "-0.25",
            "1e5",
            "2E-3",
            "1.5e+300",
            "1e400",
            "01",
            "1.",
            "-",
            "12345678901234567890",
            ".5",
            "0.000001",
        ];
        const STRINGS: [&str; 12] = [
            "\"\"",
            "\"plain\"",
            "\"caf\u{e9}\"",
            "\"\u{1f600} emoji\"",
            "\"esc \\\" \\\\ \\/ \\n\"",
            "\"\\u00e9\\ud83d\\ude00\"",
            "\"\\ud800\"",
            "\"\\x\"",
            "\"a\u{1}b\"",
            "\"unterminated",
            "\"a long string that runs past several words of eight bytes\"",
            "\"\\udc00\"",
        ];
        let ws = rng.pick(&WS);
        out.push_str(ws);
        let choice = if depth > 6 {
            rng.below(4)
        } else {
            rng.below(7)
        };
        match choice {
            0 => out.push_str(rng.pick(&NUMBERS)),
            1 => out.push_str(rng.pick(&STRINGS)),
            2 => out.push_str(rng.pick(&["true", "false", "null", "tru", "nul"])),
            3 => {
                if rng.below(20) == 0 {
                    out.push_str(&"9".repeat(250 + rng.below(100)));
                } else {
                    out.push_str(rng.pick(&NUMBERS));
                }
            }
            4 | 5 => {
                out.push('{');
                for k in 0..rng.below(5) {
                    if k > 0 {
                        out.push_str(rng.pick(&[",", ",", ",", " , ", ""]));
                    }
                    out.push_str(rng.pick(&WS));
                    out.push_str(rng.pick(&["\"k\"", "\"key\\n\"", "\"caf\u{e9}\"", "k"]));
                    out.push_str(rng.pick(&[":", " : ", ":", ""]));
                    random_value(rng, out, depth + 1);
                }
                out.push_str(rng.pick(&WS));
                out.push_str(rng.pick(&["}", "}", "}", "]", ",}"]));
            }
            _ => {
                out.push('[');
                for k in 0..rng.below(5) {
                    if k > 0 {
                        out.push_str(rng.pick(&[",", ",", " ,", ""]));
                    }
                    random_value(rng, out, depth + 1);
                }
                out.push_str(rng.pick(&WS));
                out.push_str(rng.pick(&["]", "]", "]", "}", ",]"]));
            }
        }
        out.push_str(rng.pick(&WS));
    }

    /// `skip_value` (fast path, then the checked scanner) against the checked
    /// scanner alone: the same result, the same error, the same cursor.
    fn same_as_checked(buf: &[u8], depth: usize, limits: &Limits) {
        let Ok(mut fast) = Scanner::new(buf, limits) else {
            return;
        };
        let mut checked = Scanner::new(buf, limits).unwrap();
        let got = fast.skip_value(depth);
        let want = checked.skip_value_checked(depth);
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(buf));
        assert_eq!(
            fast.pos(),
            checked.pos(),
            "{:?}",
            String::from_utf8_lossy(buf)
        );
        // And the fast path alone never takes what the checked scanner refuses.
        let probe = Scanner::new(buf, limits).unwrap();
        let start = {
            let mut s = Scanner::new(buf, limits).unwrap();
            s.skip_ws();
            s.pos()
        };
        if let Some(end) = probe.skip_fast(start, depth) {
            assert_eq!(want, Ok((start, end)), "{:?}", String::from_utf8_lossy(buf));
        }
    }

    #[test]
    fn fast_skip_matches_the_checked_scanner_on_random_values() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let limits = [
            Limits::default(),
            Limits {
                max_bytes: 1 << 20,
                max_depth: 3,
            },
        ];
        let mut fast_taken = 0;
        for n in 0..60_000 {
            let mut text = String::new();
            random_value(&mut rng, &mut text, 0);
            let l = &limits[n % 2];
            let depth = rng.below(3);
            same_as_checked(text.as_bytes(), depth, l);
            let mut s = Scanner::new(text.as_bytes(), l).unwrap();
            s.skip_ws();
            if s.skip_fast(s.pos(), depth).is_some() {
                fast_taken += 1;
            }
            // The same value, cut short or with one byte changed.
            let mut bytes = text.into_bytes();
            if !bytes.is_empty() {
                let at = rng.below(bytes.len());
                match rng.below(3) {
                    0 => bytes.truncate(at),
                    1 => bytes[at] = b"{}[]:,\"\\ 0-.eE\x01\x80\xff"[rng.below(17)],
                    _ => {
                        bytes.remove(at);
                    }
                }
                same_as_checked(&bytes, depth, l);
            }
        }
        // The fast path does take most of the valid values.
        assert!(fast_taken > 5_000, "fast path took only {fast_taken}");
    }

    #[test]
    fn fast_skip_takes_payloads_and_hands_back_the_rest() {
        let limits = Limits::default();
        let fast = |text: &str, depth: usize| {
            let s = Scanner::new(text.as_bytes(), &limits).unwrap();
            s.skip_fast(0, depth)
        };
        let payload = r#"{"toolCallId":"call_1","success":true,"result":{"bytes":512,"truncated":false,"list":[1,-2.5,null,"x",[],{}]},"durationMs":12}"#;
        assert_eq!(fast(payload, 1), Some(payload.len()));
        let spaced = "[ 1 , { \"a\" : [ ] } ]";
        assert_eq!(fast(&format!("{spaced} "), 0), Some(spaced.len()));
        // Left to the checked scanner: exponents, long numbers, deep nesting, errors.
        for (text, depth) in [
            ("1e5", 0),
            (&*"1".repeat(301), 0),
            (&*("[".repeat(65) + &"]".repeat(65)), 0),
            ("[[]]", 63),
            ("[1,]", 0),
            ("{\"a\":01}", 0),
            ("\"\\ud800\"", 0),
        ] {
            assert_eq!(fast(text, depth), None, "{text}");
        }
        // Every depth and nesting limit is the checked scanner's.
        for max_depth in 0..70 {
            let l = Limits {
                max_bytes: 1 << 20,
                max_depth,
            };
            for levels in [0, 1, 2, 63, 64, 65, 66] {
                for depth in [0, 1, 5] {
                    let text = "[".repeat(levels) + "{\"a\":[{}]}" + &"]".repeat(levels);
                    same_as_checked(text.as_bytes(), depth, &l);
                }
            }
        }
    }

    #[test]
    fn find_special_finds_the_first_byte_that_needs_care() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let alphabet = b"abcdefgh0123456789 -_:{}[],\"\\\x00\x1f\x7f\x80\xc3\xff";
        for _ in 0..20_000 {
            let len = rng.below(48);
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.below(6) == 0 {
                        alphabet[rng.below(alphabet.len())]
                    } else {
                        b'a' + rng.below(26) as u8
                    }
                })
                .collect();
            for i in 0..=len {
                let want = (i..len)
                    .find(|&j| NEEDS_CARE[buf[j] as usize])
                    .unwrap_or(len);
                assert_eq!(find_special(&buf, i), want, "{buf:?} from {i}");
            }
        }
    }

    #[test]
    fn depth_is_capped_whatever_the_limits_say() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let e = validate(
            deep.as_bytes(),
            &Limits {
                max_bytes: usize::MAX,
                max_depth: usize::MAX,
            },
        )
        .unwrap_err();
        assert!(e.message.contains("512"), "{e}");
    }

    #[test]
    fn unescape_and_write_round_trip() {
        let samples = [
            "plain",
            "quote \" back \\ slash",
            "ctl \u{1}\u{1f}\n\r\t\u{8}\u{c}",
            "é😀",
        ];
        for s in samples {
            let mut out = Vec::new();
            write_str(&mut out, s);
            let mut sc = Scanner::new(&out, &Limits::default()).unwrap();
            let span = sc.string().unwrap();
            assert_eq!(span.as_str(&out), s);
        }
        assert_eq!(unescape("\\ud83d\\ude00\\u00e9\\/"), "😀é/");
    }

    #[test]
    fn numbers_report_integrality() {
        let mut s = Scanner::new(b"-12", &Limits::default()).unwrap();
        assert_eq!(s.number().unwrap(), (0, 3, true));
        let mut s = Scanner::new(b"2.0", &Limits::default()).unwrap();
        assert_eq!(s.number().unwrap(), (0, 3, false));
        let mut s = Scanner::new(b"2e3", &Limits::default()).unwrap();
        assert!(!s.number().unwrap().2);
        for big in ["1e400", "-1e400", "1.5E+309"] {
            let mut s = Scanner::new(big.as_bytes(), &Limits::default()).unwrap();
            let err = s.number().unwrap_err();
            assert!(err.to_string().contains("out of range"), "{big}: {err}");
        }
        for fine in ["1e308", "1e-400", "-2.5e-10", "0.000001"] {
            let mut s = Scanner::new(fine.as_bytes(), &Limits::default()).unwrap();
            assert!(s.number().is_ok(), "{fine}");
        }
    }
}
