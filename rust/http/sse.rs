//! Server-sent events: [`SseDecoder`] splits a `text/event-stream` body
//! into `(event, data)` pairs, by the rules of `openstarry.sse` that the
//! `http` module's documentation lists.

use memchr::{memchr, memchr2};

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

/// Server-sent events split from a body's bytes (see the `http` module's documentation).
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
