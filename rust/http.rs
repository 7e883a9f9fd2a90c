//! HTTP/1.1 responses and server-sent events read from a byte stream: the
//! bytes under openstarry's model providers.
//!
//! [`ResponseDecoder`] takes a connection's bytes as they arrive and gives
//! back the response: its head, parsed by `httparse` (the parser under
//! hyper), and its body, framed by `Content-Length`, by the chunked transfer
//! coding (chunk sizes read by `httparse::parse_chunk_size`), or by the end of
//! the connection. Interim `1xx` heads are skipped. The body is bounded: past
//! its limit the decoder keeps exactly the limit's worth and says so.
//!
//! [`SseDecoder`] splits a `text/event-stream` body into `(event, data)`
//! pairs by the rules of `openstarry.sse`, which the Python side documents:
//! lines end at CRLF, LF or CR; a byte order mark at the start is dropped;
//! `data` lines join with LF; `event` names the event; comments, `id`,
//! `retry` and unknown fields are ignored; a blank line dispatches an event
//! that has data; an event or a line left open at the end is dropped. Lines
//! and events are bounded, in characters, and refused as soon as the excess
//! is read.

use memchr::{memchr, memchr2};

use crate::json::{Kind, Limits, Scanner, MAX_INPUT};

/// The most header fields one head may carry.
pub const MAX_HEADERS: usize = 100;
/// The longest head (status line and header fields), in bytes.
pub const MAX_HEAD: usize = 64 * 1024;
/// The longest chunk size line (with its extensions), in bytes.
const MAX_CHUNK_LINE: usize = 1024;

/// Why a response cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The bytes break HTTP/1.1 (the message says where).
    Protocol(String),
    /// The body grew past its limit; the decoder keeps the limit's worth.
    TooLarge(u64),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Protocol(msg) => f.write_str(msg),
            HttpError::TooLarge(limit) => write!(f, "the body is more than {limit} bytes"),
        }
    }
}

impl std::error::Error for HttpError {}

fn protocol(msg: impl Into<String>) -> HttpError {
    HttpError::Protocol(msg.into())
}

/// How the body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length` bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// The end of the connection.
    Close,
    /// No body (`204`, `304`).
    Empty,
}

/// A response's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// The reason phrase, as sent.
    pub reason: String,
    /// The header fields in order, names lower-cased, values as text.
    pub headers: Vec<(String, String)>,
    /// How the body ends.
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Where the decoder is in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The head is not complete yet.
    Head,
    /// The head is read; the body is not complete.
    Body,
    /// The whole response is read.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    Close,
    Done,
}

/// An HTTP/1.1 response read from the bytes a connection delivers.
#[derive(Debug)]
pub struct ResponseDecoder {
    pending: Vec<u8>,
    state: State,
    head: Option<Head>,
    body: Vec<u8>,
    received: u64,
    limit: u64,
    trailer_bytes: usize,
    /// The bytes of a head still incomplete already searched for its end.
    head_scanned: usize,
}

impl ResponseDecoder {
    /// A decoder for one response whose body may hold at most `limit` bytes.
    #[must_use]
    pub fn new(limit: u64) -> Self {
        ResponseDecoder {
            pending: Vec::new(),
            state: State::Head,
            head: None,
            body: Vec::new(),
            received: 0,
            limit,
            trailer_bytes: 0,
            head_scanned: 0,
        }
    }

    /// The head, once read.
    #[must_use]
    pub fn head(&self) -> Option<&Head> {
        self.head.as_ref()
    }

    /// Change the body's limit (an error answer is read only so far).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Where the decoder stands.
    #[must_use]
    pub fn progress(&self) -> Progress {
        match self.state {
            State::Head => Progress::Head,
            State::Done => Progress::Done,
            _ => Progress::Body,
        }
    }

    /// Bytes received past the end of the response (none from a server that
    /// waits for the next request).
    #[must_use]
    pub fn surplus(&self) -> usize {
        if self.state == State::Done {
            self.pending.len()
        } else {
            0
        }
    }

    /// The body bytes decoded since the last call.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }

    /// The body bytes decoded and not yet taken.
    #[must_use]
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Read `data`, the next bytes of the connection.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, HttpError> {
        if self.state == State::Done {
            self.pending.extend_from_slice(data);
            return Ok(Progress::Done);
        }
        if self.pending.is_empty() && self.state != State::Head {
            let used = self.step(data)?;
            self.pending.extend_from_slice(&data[used..]);
        } else {
            self.pending.extend_from_slice(data);
            let buf = std::mem::take(&mut self.pending);
            let used = self.step(&buf);
            self.pending = buf;
            let used = used?;
            self.pending.drain(..used);
        }
        Ok(self.progress())
    }

    /// The connection ended: whether that completes the response.
    ///
    /// A body framed by the connection's end is complete; any other state is
    /// a response cut short.
    pub fn eof(&mut self) -> Result<Progress, HttpError> {
        match self.state {
            State::Close => {
                self.state = State::Done;
                Ok(Progress::Done)
            }
            State::Done => Ok(Progress::Done),
            State::Head if self.pending.is_empty() => Err(protocol(
                "the server closed the connection without answering",
            )),
            _ => Err(protocol(
                "the connection closed before the response was complete",
            )),
        }
    }

    /// Decode as much of `buf` as the state allows; the bytes used.
    fn step(&mut self, buf: &[u8]) -> Result<usize, HttpError> {
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            match self.state {
                State::Done => return Ok(pos),
                State::Head => match self.parse_head(rest)? {
                    Some(used) => pos += used,
                    None => return Ok(pos),
                },
                State::Length(left) => {
                    let n = (rest.len() as u64).min(left) as usize;
                    self.push_body(&rest[..n])?;
                    pos += n;
                    self.state = if left == n as u64 {
                        State::Done
                    } else {
                        State::Length(left - n as u64)
                    };
                    if self.state != State::Done {
                        return Ok(pos);
                    }
                }
                State::Close => {
                    self.push_body(rest)?;
                    return Ok(buf.len());
                }
                State::ChunkSize => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((used, _))) if used > MAX_CHUNK_LINE => {
                        return Err(protocol("a chunk size line longer than 1024 bytes"));
                    }
                    Ok(httparse::Status::Complete((used, size))) => {
                        pos += used;
                        self.state = if size == 0 {
                            State::Trailers
                        } else {
                            State::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) => {
                        if rest.len() > MAX_CHUNK_LINE {
                            return Err(protocol("a chunk size line longer than 1024 bytes"));
                        }
                        return Ok(pos);
                    }
                    Err(_) => return Err(protocol("an invalid chunk size")),
                },
                State::ChunkData(left) => {
                    let n = (rest.len() as u64).min(left) as usize;
                    self.push_body(&rest[..n])?;
                    pos += n;
                    if left == n as u64 {
                        self.state = State::ChunkEnd;
                    } else {
                        self.state = State::ChunkData(left - n as u64);
                        return Ok(pos);
                    }
                }
                State::ChunkEnd => {
                    if rest.starts_with(b"\r\n") {
                        pos += 2;
                    } else if rest.starts_with(b"\n") {
                        pos += 1;
                    } else if rest.is_empty() || rest == b"\r" {
                        return Ok(pos);
                    } else {
                        return Err(protocol("a chunk not followed by CRLF"));
                    }
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let Some(end) = memchr(b'\n', rest) else {
                        if self.trailer_bytes + rest.len() > MAX_HEAD {
                            return Err(protocol("trailer fields longer than 64 KiB"));
                        }
                        return Ok(pos);
                    };
                    self.trailer_bytes += end + 1;
                    if self.trailer_bytes > MAX_HEAD {
                        return Err(protocol("trailer fields longer than 64 KiB"));
                    }
                    let line = &rest[..end];
                    pos += end + 1;
                    if line.is_empty() || line == b"\r" {
                        self.state = State::Done;
                    }
                }
            }
        }
    }

    fn push_body(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        let room = self.limit.saturating_sub(self.received);
        if bytes.len() as u64 > room {
            self.body.extend_from_slice(&bytes[..room as usize]);
            self.received = self.limit;
            return Err(HttpError::TooLarge(self.limit));
        }
        self.received += bytes.len() as u64;
        self.body.extend_from_slice(bytes);
        Ok(())
    }

    /// Parse a head at the start of `buf`: the bytes it took, or `None` for more.
    fn parse_head(&mut self, buf: &[u8]) -> Result<Option<usize>, HttpError> {
        // Parse only once the blank line that ends a head is there, looking at the new
        // bytes alone: a head that comes a byte at a time is not parsed again each time.
        let from = self.head_scanned.saturating_sub(3);
        let ended = memchr::memmem::find(&buf[from..], b"\n\r\n").is_some()
            || memchr::memmem::find(&buf[from..], b"\n\n").is_some();
        if !ended {
            if buf.len() > MAX_HEAD {
                return Err(protocol("a response head longer than 64 KiB"));
            }
            self.head_scanned = buf.len();
            return Ok(None);
        }
        self.head_scanned = 0;
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut fields);
        let used = match response.parse(buf) {
            Ok(httparse::Status::Complete(used)) => used,
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD {
                    return Err(protocol("a response head longer than 64 KiB"));
                }
                return Ok(None);
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(protocol(format!(
                    "a response head with more than {MAX_HEADERS} fields"
                )))
            }
            Err(e) => return Err(protocol(format!("an invalid response head ({e})"))),
        };
        if used > MAX_HEAD {
            return Err(protocol("a response head longer than 64 KiB"));
        }
        let status = response.code.unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            // An interim answer (100 Continue, 103 Early Hints): the real one follows.
            return Ok(Some(used));
        }
        let http10 = response.version == Some(0);
        let mut headers = Vec::with_capacity(response.headers.len());
        let mut length: Option<u64> = None;
        let mut chunked = false;
        let mut close = http10;
        for field in response.headers.iter() {
            let name = field.name.to_ascii_lowercase();
            let value = String::from_utf8_lossy(field.value).into_owned();
            match name.as_str() {
                "content-length" => {
                    let n: u64 = value
                        .trim()
                        .parse()
                        .map_err(|_| protocol(format!("an invalid Content-Length: {value:?}")))?;
                    if length.is_some_and(|m| m != n) {
                        return Err(protocol("two different Content-Length fields"));
                    }
                    length = Some(n);
                }
                "transfer-encoding" => {
                    let last = value.rsplit(',').next().unwrap_or("").trim();
                    chunked = last.eq_ignore_ascii_case("chunked");
                    if !chunked {
                        return Err(protocol(format!(
                            "an unsupported Transfer-Encoding: {value}"
                        )));
                    }
                }
                "connection" => {
                    for token in value.split(',') {
                        let token = token.trim();
                        if token.eq_ignore_ascii_case("close") {
                            close = true;
                        } else if token.eq_ignore_ascii_case("keep-alive") && http10 {
                            close = false;
                        }
                    }
                }
                _ => {}
            }
            headers.push((name, value));
        }
        let framing = if status == 204 || status == 304 {
            Framing::Empty
        } else if chunked {
            Framing::Chunked
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            Framing::Close
        };
        self.state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        self.head = Some(Head {
            status,
            reason: response.reason.unwrap_or("").to_owned(),
            headers,
            framing,
            keep_alive: !close && framing != Framing::Close,
        });
        Ok(Some(used))
    }
}

/// Why an event stream is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// A line longer than the bound, in characters.
    Line(usize),
    /// An event whose data grew past the bound, in characters.
    Event(usize),
}

impl std::fmt::Display for SseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SseError::Line(n) => {
                write!(f, "a server-sent event line is longer than {n} characters")
            }
            SseError::Event(n) => {
                write!(f, "a server-sent event carries more than {n} characters")
            }
        }
    }
}

impl std::error::Error for SseError {}

/// One dispatched event: its name (`None` when unnamed) and its data.
pub type SseEvent = (Option<String>, String);

/// Server-sent events split from a body's bytes (see the module's documentation).
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    /// The characters of `line` counted so far: only once its bytes pass `max_line`.
    line_chars: usize,
    /// The bytes of `line` already in `line_chars` (a code point cut by a read waits).
    line_counted: usize,
    data: String,
    /// The characters of `data[..data_counted]`: counted only once the data's bytes pass
    /// `max_event` (an event counts its characters and one, as `openstarry.sse` counts).
    data_chars: usize,
    data_counted: usize,
    has_data: bool,
    event: Option<String>,
    after_cr: bool,
    started: bool,
    max_line: usize,
    max_event: usize,
}

/// How many characters `bytes` decode to, as `String::from_utf8_lossy` (and Python's
/// `errors="replace"`) decode them: one U+FFFD for each invalid sequence. With `last`
/// false, a sequence cut short at the end is left for the next bytes: the second value
/// is how many bytes were counted.
fn decoded_chars(bytes: &[u8], last: bool) -> (usize, usize) {
    // std's count of a str's chars reads a word at a time.
    let valid_chars = |b: &[u8]| std::str::from_utf8(b).map_or(0, |t| t.chars().count());
    let mut n = 0;
    let mut i = 0;
    loop {
        match std::str::from_utf8(&bytes[i..]) {
            Ok(text) => return (n + text.chars().count(), bytes.len()),
            Err(e) => {
                let valid = e.valid_up_to();
                n += valid_chars(&bytes[i..i + valid]);
                match e.error_len() {
                    Some(bad) => {
                        n += 1;
                        i += valid + bad;
                    }
                    None if last => return (n + 1, bytes.len()),
                    None => return (n, i + valid),
                }
            }
        }
    }
}

impl SseDecoder {
    /// A decoder refusing lines past `max_line` and events past `max_event` characters.
    #[must_use]
    pub fn new(max_line: usize, max_event: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            line_chars: 0,
            line_counted: 0,
            data: String::new(),
            data_chars: 0,
            data_counted: 0,
            has_data: false,
            event: None,
            after_cr: false,
            started: false,
            max_line,
            max_event,
        }
    }

    /// The events that `chunk` completes, appended to `out` in order.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if chunk.is_empty() {
            return Ok(()); // nothing read: a CR held back still waits for its LF
        }
        if !self.started {
            // The byte order mark, at the very start only (it may come split).
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let have = self.line.len();
            let take = (BOM.len() - have).min(chunk.len());
            let head = &chunk[..take];
            if BOM[have..have + take] == *head {
                if have + take < BOM.len() {
                    self.line.extend_from_slice(head);
                    return Ok(());
                }
                self.line.clear();
                chunk = &chunk[take..];
            } else {
                // Not a mark: what was held back is the line's start.
                let (n, used) = decoded_chars(&self.line, false);
                self.line_chars = n;
                self.line_counted = used;
            }
            self.started = true;
        }
        if self.after_cr {
            self.after_cr = false;
            if chunk.first() == Some(&b'\n') {
                chunk = &chunk[1..];
            }
        }
        while let Some(end) = memchr2(b'\r', b'\n', chunk) {
            let piece = &chunk[..end];
            if self.line.is_empty() {
                // No more characters than bytes: a line within the bound in bytes is.
                if piece.len() > self.max_line {
                    self.check_line(decoded_chars(piece, true).0)?;
                }
                self.line_done(piece, out)?;
            } else {
                self.line.extend_from_slice(piece);
                if self.line.len() > self.max_line {
                    let (n, _) = decoded_chars(&self.line[self.line_counted..], true);
                    self.check_line(self.line_chars + n)?;
                }
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, out)?;
                self.line = line;
                self.line.clear();
            }
            self.line_chars = 0;
            self.line_counted = 0;
            if chunk[end] == b'\r' {
                match chunk.get(end + 1) {
                    Some(b'\n') => chunk = &chunk[end + 2..],
                    Some(_) => chunk = &chunk[end + 1..],
                    None => {
                        self.after_cr = true;
                        return Ok(());
                    }
                }
            } else {
                chunk = &chunk[end + 1..];
            }
        }
        self.grow(chunk)
    }

    fn check_line(&self, n: usize) -> Result<(), SseError> {
        if n > self.max_line {
            Err(SseError::Line(self.max_line))
        } else {
            Ok(())
        }
    }

    fn grow(&mut self, piece: &[u8]) -> Result<(), SseError> {
        self.line.extend_from_slice(piece);
        if self.line.len() <= self.max_line {
            return Ok(()); // within the bound in bytes, so in characters: counted later if need be
        }
        let (n, used) = decoded_chars(&self.line[self.line_counted..], false);
        self.line_chars += n;
        self.line_counted += used;
        self.check_line(self.line_chars)
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            if self.has_data {
                let data = std::mem::take(&mut self.data);
                out.push((self.event.take(), data));
            }
            self.event = None;
            self.has_data = false;
            self.data_chars = 0;
            self.data_counted = 0;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (name, mut value) = match memchr(b':', line) {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b""[..]),
        };
        if value.first() == Some(&b' ') {
            value = &value[1..];
        }
        match name {
            b"data" => {
                // Bytes bound characters: they are counted only when the bytes pass it.
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
                if self.data.len() + 1 > self.max_event {
                    self.data_chars += self.data[self.data_counted..].chars().count();
                    self.data_counted = self.data.len();
                    if self.data_chars + 1 > self.max_event {
                        return Err(SseError::Event(self.max_event));
                    }
                }
            }
            b"event" => {
                self.event = if value.is_empty() {
                    None
                } else {
                    Some(String::from_utf8_lossy(value).into_owned())
                };
            }
            _ => {}
        }
        Ok(())
    }

    /// The stream ended: an event or a line still open is dropped.
    pub fn close(&mut self) {
        self.line.clear();
        self.line_chars = 0;
        self.line_counted = 0;
        self.data.clear();
        self.data_chars = 0;
        self.data_counted = 0;
        self.has_data = false;
        self.event = None;
        self.after_cr = false;
    }
}

/// How a Chat Completions chunk reads to the stream's text fast path.
#[derive(Debug, PartialEq, Eq)]
pub enum ChatChunk {
    /// A chunk that carries text and nothing else the assembler keeps (and
    /// whether it names both its `id` and its `model`).
    Text(String, bool),
    /// Any other event; `meta` when it names both its `id` and its `model`.
    Other { meta: bool },
}

/// The most nesting a text-only chunk may have (`{"choices":[{"delta":{...}}]}`
/// is four deep; deeper values are skipped within this bound).
const CHUNK_DEPTH: usize = 64;

/// Classify one `chat.completion.chunk` (an event's data) for the text fast
/// path: [`ChatChunk::Text`] only when the chunk is exactly what the Chat
/// Completions assembler would read as text alone: an object whose `choices`
/// is one choice (index 0) whose `delta` has a non-empty string `content` and
/// no `refusal`, `tool_calls` or `function_call` (other delta fields, such as
/// `role`, the assembler ignores), no `finish_reason`, and no `usage` or
/// `error` beside it. Keys written with escapes, repeated keys and anything
/// unexpected make it [`ChatChunk::Other`], which the assembler reads in full.
#[must_use]
pub fn chat_chunk(data: &[u8]) -> ChatChunk {
    let mut meta = (false, false);
    let text = chat_text(data, &mut meta).ok().flatten();
    let meta = meta.0 && meta.1;
    match text {
        Some(text) => ChatChunk::Text(text, meta),
        None => ChatChunk::Other { meta },
    }
}

type Scan<T> = Result<T, crate::json::JsonError>;

fn nonempty_string(s: &mut Scanner<'_>) -> Scan<bool> {
    if s.peek_kind()? == Kind::String {
        let span = s.string()?;
        Ok(!span.is_empty())
    } else {
        s.skip_value(1)?;
        Ok(false)
    }
}

/// Whether the value at the cursor is `null` (consumed either way).
fn null(s: &mut Scanner<'_>) -> Scan<bool> {
    if s.peek_kind()? == Kind::Null {
        s.literal(Kind::Null)?;
        Ok(true)
    } else {
        s.skip_value(1)?;
        Ok(false)
    }
}

/// Walk the object at the cursor: `field(scanner, key)` reads each value and says
/// whether it keeps the chunk plain. A key written with escapes is skipped and makes
/// the chunk not plain. Whether every field kept it plain.
fn fields(
    s: &mut Scanner<'_>,
    depth: usize,
    mut field: impl FnMut(&mut Scanner<'_>, &[u8]) -> Scan<bool>,
) -> Scan<bool> {
    let buf = s.buf();
    s.begin_object()?;
    let mut plain = true;
    let mut first = true;
    while let Some(key) = s.next_key(first)? {
        first = false;
        if key.escaped() {
            s.skip_value(depth)?;
            plain = false;
        } else {
            plain &= field(s, key.raw(buf))?;
        }
    }
    Ok(plain)
}

/// The value at the cursor skipped: a field the assembler ignores.
fn ignored(s: &mut Scanner<'_>, depth: usize) -> Scan<bool> {
    s.skip_value(depth)?;
    Ok(true)
}

/// The value at the cursor read by `read` when it is an object, else skipped (`None`).
fn object<T>(
    s: &mut Scanner<'_>,
    depth: usize,
    read: impl FnOnce(&mut Scanner<'_>) -> Scan<Option<T>>,
) -> Scan<Option<T>> {
    if s.peek_kind()? == Kind::Object {
        read(s)
    } else {
        s.skip_value(depth)?;
        Ok(None)
    }
}

fn chat_text(data: &[u8], meta: &mut (bool, bool)) -> Scan<Option<String>> {
    let limits = Limits {
        max_bytes: MAX_INPUT,
        max_depth: CHUNK_DEPTH,
    };
    let mut s = Scanner::new(data, &limits)?;
    let mut text: Option<Option<String>> = None;
    let plain = object(&mut s, 0, |s| {
        let plain = fields(s, 1, |s, key| match key {
            b"choices" if text.is_none() => {
                text = Some(chat_choices(s)?);
                Ok(true)
            }
            b"usage" | b"error" => null(s),
            b"id" => {
                meta.0 = nonempty_string(s)?;
                Ok(true)
            }
            b"model" => {
                meta.1 = nonempty_string(s)?;
                Ok(true)
            }
            b"choices" => Ok(!ignored(s, 1)?),
            _ => ignored(s, 1),
        })?;
        Ok(Some(plain))
    })?;
    s.finish()?;
    Ok(if plain == Some(true) {
        text.flatten()
    } else {
        None
    })
}

fn chat_choices(s: &mut Scanner<'_>) -> Scan<Option<String>> {
    if s.peek_kind()? != Kind::Array {
        s.skip_value(1)?;
        return Ok(None);
    }
    s.begin_array()?;
    if !s.next_item(true)? {
        return Ok(None);
    }
    let text = object(s, 2, chat_choice)?;
    if s.next_item(false)? {
        // A second choice: the assembler reads it (and skips it unless its index is 0).
        while {
            s.skip_value(2)?;
            s.next_item(false)?
        } {}
        return Ok(None);
    }
    Ok(text)
}

fn chat_choice(s: &mut Scanner<'_>) -> Scan<Option<String>> {
    let mut text: Option<Option<String>> = None;
    let plain = fields(s, 3, |s, key| match key {
        b"index" => {
            if s.peek_kind()? == Kind::Number {
                let (start, end, _) = s.number()?;
                Ok(&s.buf()[start..end] == b"0")
            } else {
                Ok(!ignored(s, 3)?)
            }
        }
        b"delta" if text.is_none() => {
            text = Some(object(s, 3, chat_delta)?);
            Ok(true)
        }
        // The assembler takes a non-empty string; null and "" say nothing.
        b"finish_reason" if s.peek_kind()? == Kind::String => Ok(s.string()?.is_empty()),
        b"finish_reason" => null(s),
        b"delta" => Ok(!ignored(s, 3)?),
        _ => ignored(s, 3),
    })?;
    Ok(if plain { text.flatten() } else { None })
}

fn chat_delta(s: &mut Scanner<'_>) -> Scan<Option<String>> {
    let mut content: Option<Option<String>> = None;
    let plain = fields(s, 4, |s, key| match key {
        b"content" if content.is_none() => {
            content = Some(if s.peek_kind()? == Kind::String {
                let span = s.string()?;
                Some(span.as_str(s.buf()).into_owned())
            } else {
                s.skip_value(4)?;
                None
            });
            Ok(true)
        }
        b"refusal" | b"tool_calls" | b"function_call" => null(s),
        b"content" => Ok(!ignored(s, 4)?),
        _ => ignored(s, 4),
    })?;
    Ok(if plain {
        content.flatten().filter(|c| !c.is_empty())
    } else {
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(parts: &[&[u8]], limit: u64) -> (ResponseDecoder, Vec<u8>, Progress) {
        let mut d = ResponseDecoder::new(limit);
        let mut body = Vec::new();
        let mut p = Progress::Head;
        for part in parts {
            p = d.feed(part).unwrap();
            body.extend(d.take_body());
        }
        (d, body, p)
    }

    #[test]
    fn a_length_framed_response_in_one_read_and_byte_by_byte() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        let (d, body, p) = read_all(&[raw], 1024);
        assert_eq!(p, Progress::Done);
        assert_eq!(body, b"{\"a\":1}");
        let head = d.head().unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.reason, "OK");
        assert!(head.keep_alive);
        assert_eq!(
            head.headers[0],
            ("content-type".into(), "application/json".into())
        );
        let bytes: Vec<&[u8]> = raw.chunks(1).collect();
        let (_, body, p) = read_all(&bytes, 1024);
        assert_eq!((p, body.as_slice()), (Progress::Done, &b"{\"a\":1}"[..]));
    }

    #[test]
    fn a_chunked_response_with_extensions_and_trailers_split_anywhere() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 0..raw.len() {
            let (d, body, p) = read_all(&[&raw[..cut], &raw[cut..]], 1024);
            assert_eq!(p, Progress::Done, "cut at {cut}");
            assert_eq!(body, b"hello world");
            assert_eq!(d.surplus(), 0);
        }
    }

    #[test]
    fn interim_heads_are_skipped_and_empty_statuses_have_no_body() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let (d, body, p) = read_all(&[raw], 10);
        assert_eq!(
            (p, body.len(), d.head().unwrap().status),
            (Progress::Done, 0, 204)
        );
    }

    #[test]
    fn a_body_to_the_connections_end() {
        let mut d = ResponseDecoder::new(100);
        assert_eq!(
            d.feed(b"HTTP/1.0 200 OK\r\n\r\nabc").unwrap(),
            Progress::Body
        );
        assert!(!d.head().unwrap().keep_alive);
        assert_eq!(d.eof().unwrap(), Progress::Done);
        assert_eq!(d.take_body(), b"abc");
    }

    #[test]
    fn a_cut_response_and_bad_bytes_are_errors() {
        let mut d = ResponseDecoder::new(100);
        d.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab")
            .unwrap();
        assert!(d.eof().is_err());
        let mut d = ResponseDecoder::new(100);
        assert!(d.eof().is_err());
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
            b"SMTP nonsense\r\n\r\n",
        ] {
            assert!(
                ResponseDecoder::new(100).feed(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_body_past_its_limit_keeps_the_limits_worth() {
        let mut d = ResponseDecoder::new(4);
        let err = d
            .feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
            .unwrap_err();
        assert_eq!(err, HttpError::TooLarge(4));
        assert_eq!(d.take_body(), b"0123");
    }

    #[test]
    fn a_head_without_end_is_bounded() {
        let mut d = ResponseDecoder::new(4);
        d.feed(b"HTTP/1.1 200 OK\r\n").unwrap();
        let filler = vec![b'a'; MAX_HEAD + 10];
        assert!(d.feed(&filler).is_err());
    }

    fn events(parts: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new(100, 100);
        let mut out = Vec::new();
        for p in parts {
            d.feed(p, &mut out).unwrap();
        }
        d.close();
        out
    }

    #[test]
    fn sse_line_ends_fields_and_multi_line_data_split_anywhere() {
        let raw = b"\xEF\xBB\xBF: hi\r\nevent: delta\r\ndata: a\rdata:b\n\nid: 7\ndata: c\r\n\r\nevent: x\n\ndata: open";
        let want = vec![
            (Some("delta".to_owned()), "a\nb".to_owned()),
            (None, "c".to_owned()),
        ];
        for cut in 0..raw.len() {
            assert_eq!(events(&[&raw[..cut], &raw[cut..]]), want, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = raw.chunks(1).collect();
        assert_eq!(events(&bytes), want);
    }

    #[test]
    fn chat_chunks_that_carry_text_alone() {
        let text = |t: &str, meta: bool| ChatChunk::Text(t.to_owned(), meta);
        let base = r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi \"x\""},"logprobs":null,"finish_reason":null}]}"#;
        assert_eq!(chat_chunk(base.as_bytes()), text("hi \"x\"", true));
        let role = r#"{"choices":[{"delta":{"role":"assistant","content":"a","refusal":null}}],"usage":null}"#;
        assert_eq!(chat_chunk(role.as_bytes()), text("a", false));
        for other in [
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a","tool_calls":[]}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"total_tokens":1}}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"error":{"message":"x"}}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"choices":[]}"#,
            r#"{"ch\u006fices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}]"#,
            "[DONE]",
        ] {
            assert!(
                matches!(chat_chunk(other.as_bytes()), ChatChunk::Other { .. }),
                "{other}"
            );
        }
        assert_eq!(
            chat_chunk(br#"{"id":"c","model":"m","choices":[]}"#),
            ChatChunk::Other { meta: true }
        );
    }

    #[test]
    fn sse_bounds_count_invalid_bytes_as_the_replacement_characters_they_become() {
        let mut out = Vec::new();
        let mut d = SseDecoder::new(10, 10);
        assert!(matches!(
            d.feed(&[0x80; 64], &mut out),
            Err(SseError::Line(10))
        ));
        let mut d = SseDecoder::new(100, 10);
        let mut line = b"data:".to_vec();
        line.extend([0x80; 20]);
        line.push(b'\n');
        assert!(matches!(d.feed(&line, &mut out), Err(SseError::Event(10))));
        // A code point cut by a read counts once, when it is whole.
        let mut d = SseDecoder::new(7, 100);
        d.feed("data:\u{e9}".as_bytes().split_at(6).0, &mut out)
            .unwrap();
        d.feed(&"data:\u{e9}".as_bytes()[6..], &mut out).unwrap();
        d.feed(b"\n\n", &mut out).unwrap();
        assert_eq!(out, vec![(None, "\u{e9}".to_owned())]);
    }

    #[test]
    fn an_empty_read_between_cr_and_lf_changes_nothing() {
        let mut out = Vec::new();
        let mut d = SseDecoder::new(100, 100);
        for part in [&b"data: a\r"[..], b"", b"\ndata: b\n\n"] {
            d.feed(part, &mut out).unwrap();
        }
        assert_eq!(out, vec![(None, "a\nb".to_owned())]);
    }

    #[test]
    fn a_long_chunk_size_line_is_refused_however_it_arrives() {
        let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
        raw.extend(vec![b'a'; 2000]);
        raw.extend(b"\r\nx\r\n0\r\n\r\n");
        assert!(ResponseDecoder::new(100).feed(&raw).is_err());
        let mut d = ResponseDecoder::new(100);
        assert!(d.feed(&raw[..1500]).is_err() || d.feed(&raw[1500..]).is_err());
    }

    #[test]
    fn sse_bounds_count_characters() {
        let mut d = SseDecoder::new(6, 6);
        let mut out = Vec::new();
        d.feed("data:é\n".as_bytes(), &mut out).unwrap();
        assert!(matches!(
            d.feed(b"data: abc", &mut out),
            Err(SseError::Line(6))
        ));
        let mut d = SseDecoder::new(10, 6);
        d.feed(b"data: abc\n", &mut out).unwrap();
        assert!(matches!(
            d.feed(b"data: abc\n", &mut out),
            Err(SseError::Event(6))
        ));
    }
}
