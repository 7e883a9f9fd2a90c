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

use memchr::memchr;

mod chat;
mod sse;

pub use chat::{chat_chunk, ChatChunk};
pub use sse::{SseDecoder, SseError, SseEvent};

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

#[cfg(test)]
mod tests;
