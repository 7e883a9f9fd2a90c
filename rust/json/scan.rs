//! The validating [`Scanner`]: a cursor over one JSON document that checks
//! its grammar, UTF-8, number ranges and nesting depth as it goes, and skips
//! whole values in one fast pass where it can; with the byte-level helpers
//! only it uses.

use super::{
    find_special, hex4, JsonError, Kind, Limits, Span, MAX_DEPTH, MAX_INPUT, MAX_INT_DIGITS,
};

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

fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}
