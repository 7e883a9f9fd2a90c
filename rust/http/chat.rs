//! The text fast path of a Chat Completions stream: [`chat_chunk`] tells a
//! `chat.completion.chunk` that carries text alone from every other event.

use crate::json::{Kind, Limits, Scanner, MAX_INPUT};

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
