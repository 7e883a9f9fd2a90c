//! `ProviderResponse`, `ContentSegment` and `ToolCall` of spec 000 section 3:
//! decoding to an index of spans with the per-type rules checked.
//!
//! A `tool_call` segment needs `toolCall.name`; `toolCall.args` given as a JSON
//! string is parsed; a `text` segment needs `text`; media segments (`image`,
//! `audio`, `video`) need `data`; a `ui` segment needs `ui`. A `null` optional
//! field counts as absent. Unknown fields are kept for re-encoding.

use crate::json::{JsonError, KeySet, Kind, Limits, Scanner, Span};

/// How deep the values that hold arbitrary JSON sit in a response: the
/// encoders allow them as many levels as the decoder will.
pub const METADATA_DEPTH: usize = 1;
pub const UI_DEPTH: usize = 3;
pub const ARGS_DEPTH: usize = 4;

/// What a segment carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentType {
    Text,
    Image,
    Audio,
    Video,
    Ui,
    ToolCall,
    Reasoning,
}

impl SegmentType {
    /// The wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Text => "text",
            SegmentType::Image => "image",
            SegmentType::Audio => "audio",
            SegmentType::Video => "video",
            SegmentType::Ui => "ui",
            SegmentType::ToolCall => "tool_call",
            SegmentType::Reasoning => "reasoning",
        }
    }

    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "text" => SegmentType::Text,
            "image" => SegmentType::Image,
            "audio" => SegmentType::Audio,
            "video" => SegmentType::Video,
            "ui" => SegmentType::Ui,
            "tool_call" => SegmentType::ToolCall,
            "reasoning" => SegmentType::Reasoning,
            _ => return None,
        })
    }

    /// The field a segment of this type must carry, by its wire name.
    #[must_use]
    pub fn required_field(self) -> &'static str {
        match self {
            SegmentType::Text | SegmentType::Reasoning => "text",
            SegmentType::Image | SegmentType::Audio | SegmentType::Video => "data",
            SegmentType::Ui => "ui",
            SegmentType::ToolCall => "toolCall",
        }
    }
}

/// A byte range of raw JSON in the input.
pub type Raw = (usize, usize);

/// How a tool call's arguments arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args {
    /// Absent or `null`: the arguments are `{}`.
    Missing,
    /// A JSON value in place.
    Value(Raw),
    /// A JSON string holding JSON text (already validated), as some APIs send it.
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallIndex {
    pub id: Option<Span>,
    pub name: Span,
    pub args: Args,
    pub extra: Vec<(Span, Raw)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIndex {
    pub kind: SegmentType,
    pub text: Option<Span>,
    pub data: Option<Span>,
    pub mime_type: Option<Span>,
    /// A `reasoning` segment's opaque proof for the provider.
    pub signature: Option<Span>,
    pub tool_call: Option<ToolCallIndex>,
    pub ui: Option<Raw>,
    pub extra: Vec<(Span, Raw)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseIndex {
    pub segments: Vec<SegmentIndex>,
    pub metadata: Option<Raw>,
    pub extra: Vec<(Span, Raw)>,
}

#[cold]
fn err(field: &str, at: usize, msg: impl Into<String>) -> JsonError {
    JsonError::at(at, msg).in_field(field)
}

/// Iterate over an object's keys, rejecting duplicates; `f` must consume each value.
fn object<'a>(
    s: &mut Scanner<'a>,
    path: &str,
    mut f: impl FnMut(&mut Scanner<'a>, Span, &str) -> Result<(), JsonError>,
) -> Result<(), JsonError> {
    let buf = s.buf();
    let kind = s.peek_kind()?;
    if kind != Kind::Object {
        return Err(err(
            path,
            s.pos(),
            format!("expected an object, found {}", kind.name()),
        ));
    }
    s.begin_object()?;
    let mut keys = KeySet::default();
    let mut first = true;
    while let Some(key) = s.next_key(first)? {
        first = false;
        let name = key.as_str(buf);
        if !keys.insert(name.clone()) {
            return Err(err(&join(path, &name), key.start() - 1, "duplicate field"));
        }
        f(s, key, &name)?;
    }
    Ok(())
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// A string, or `None` for `null`.
fn opt_string(s: &mut Scanner<'_>, path: &str) -> Result<Option<Span>, JsonError> {
    match s.peek_kind()? {
        Kind::Null => {
            s.literal(Kind::Null)?;
            Ok(None)
        }
        Kind::String => Ok(Some(s.string()?)),
        k => Err(err(
            path,
            s.pos(),
            format!("expected a string, found {}", k.name()),
        )),
    }
}

/// A raw value, or `None` for `null`.
fn opt_value(s: &mut Scanner<'_>, depth: usize) -> Result<Option<Raw>, JsonError> {
    if s.peek_kind()? == Kind::Null {
        s.literal(Kind::Null)?;
        return Ok(None);
    }
    Ok(Some(s.skip_value(depth)?))
}

/// Decode and validate a `ProviderResponse`.
pub fn decode(buf: &[u8], limits: &Limits) -> Result<ResponseIndex, JsonError> {
    let mut s = Scanner::new(buf, limits)?;
    let mut resp = ResponseIndex {
        segments: Vec::new(),
        metadata: None,
        extra: Vec::new(),
    };
    let mut have_segments = false;
    object(&mut s, "", |s, key, name| {
        match name {
            "segments" => {
                have_segments = true;
                let kind = s.peek_kind()?;
                if kind != Kind::Array {
                    return Err(err(
                        "segments",
                        s.pos(),
                        format!("expected an array, found {}", kind.name()),
                    ));
                }
                s.enter(1)?;
                s.begin_array()?;
                let mut first = true;
                while s.next_item(first)? {
                    first = false;
                    let path = format!("segments[{}]", resp.segments.len());
                    resp.segments.push(segment(s, &path, limits)?);
                }
            }
            "metadata" => resp.metadata = opt_value(s, METADATA_DEPTH)?,
            _ => resp.extra.push((key, s.skip_value(1)?)),
        }
        Ok(())
    })?;
    s.finish()?;
    if !have_segments {
        return Err(JsonError::field("segments", "missing required field"));
    }
    Ok(resp)
}

fn segment(s: &mut Scanner<'_>, path: &str, limits: &Limits) -> Result<SegmentIndex, JsonError> {
    let buf = s.buf();
    let start = s.pos();
    s.enter(2)?;
    let mut kind = None;
    let mut seg = SegmentIndex {
        kind: SegmentType::Text,
        text: None,
        data: None,
        mime_type: None,
        signature: None,
        tool_call: None,
        ui: None,
        extra: Vec::new(),
    };
    object(s, path, |s, key, name| {
        let field = join(path, name);
        match name {
            "type" => {
                s.skip_ws();
                let at = s.pos();
                let span = opt_string(s, &field)?
                    .ok_or_else(|| err(&field, at, "expected a string, found null"))?;
                let value = span.as_str(buf);
                kind = Some(SegmentType::parse(&value).ok_or_else(|| {
                    err(&field, at, format!("unknown segment type {value:?}; expected text, image, audio, video, ui, tool_call or reasoning"))
                })?);
            }
            "text" => seg.text = opt_string(s, &field)?,
            "data" => seg.data = opt_string(s, &field)?,
            "mimeType" => seg.mime_type = opt_string(s, &field)?,
            "signature" => seg.signature = opt_string(s, &field)?,
            "ui" => seg.ui = opt_value(s, UI_DEPTH)?,
            "toolCall" => {
                if s.peek_kind()? == Kind::Null {
                    s.literal(Kind::Null)?;
                } else {
                    seg.tool_call = Some(tool_call(s, &field, limits)?);
                }
            }
            _ => seg.extra.push((key, s.skip_value(3)?)),
        }
        Ok(())
    })?;
    seg.kind = kind.ok_or_else(|| err(&join(path, "type"), start, "missing required field"))?;
    let present = match seg.kind {
        SegmentType::Text | SegmentType::Reasoning => seg.text.is_some(),
        SegmentType::Image | SegmentType::Audio | SegmentType::Video => seg.data.is_some(),
        SegmentType::Ui => seg.ui.is_some(),
        SegmentType::ToolCall => seg.tool_call.is_some(),
    };
    if !present {
        let required = seg.kind.required_field();
        return Err(err(
            &join(path, required),
            start,
            format!("a {} segment needs {required}", seg.kind.as_str()),
        ));
    }
    Ok(seg)
}

fn tool_call(s: &mut Scanner<'_>, path: &str, limits: &Limits) -> Result<ToolCallIndex, JsonError> {
    let buf = s.buf();
    let start = s.pos();
    s.enter(3)?;
    let mut call = ToolCallIndex {
        id: None,
        name: Span::default(),
        args: Args::Missing,
        extra: Vec::new(),
    };
    let mut name_seen = false;
    object(s, path, |s, key, name| {
        let field = join(path, name);
        match name {
            "id" => call.id = opt_string(s, &field)?,
            "name" => {
                s.skip_ws();
                let at = s.pos();
                match opt_string(s, &field)? {
                    Some(span) if !span.is_empty() => {
                        call.name = span;
                        name_seen = true;
                    }
                    _ => return Err(err(&field, at, "must be a non-empty string")),
                }
            }
            "args" => {
                call.args = match s.peek_kind()? {
                    Kind::Null => {
                        s.literal(Kind::Null)?;
                        Args::Missing
                    }
                    Kind::String => {
                        s.skip_ws();
                        let at = s.pos();
                        let span = s.string()?;
                        let text = span.as_str(buf).into_owned();
                        args_text(&text, limits).map_err(|e| err(&field, at, e.message.clone()))?;
                        Args::Text(text)
                    }
                    _ => Args::Value(s.skip_value(ARGS_DEPTH)?),
                };
            }
            _ => call.extra.push((key, s.skip_value(4)?)),
        }
        Ok(())
    })?;
    if !name_seen {
        return Err(err(&join(path, "name"), start, "missing required field"));
    }
    Ok(call)
}

/// Check arguments sent as JSON text: a JSON object, within the depth it will
/// have once encoded in place.
pub fn args_text(text: &str, limits: &Limits) -> Result<(), JsonError> {
    let inner = Limits {
        max_bytes: limits.max_bytes,
        max_depth: limits
            .max_depth
            .min(crate::json::MAX_DEPTH)
            .saturating_sub(ARGS_DEPTH),
    };
    let bad = |e: JsonError| JsonError::at(0, format!("a string that is not valid JSON: {e}"));
    let mut s = Scanner::new(text.as_bytes(), &inner).map_err(bad)?;
    let kind = s.peek_kind().map_err(bad)?;
    if kind != Kind::Object {
        return Err(JsonError::at(
            0,
            format!("a string must hold a JSON object, not {}", kind.name()),
        ));
    }
    s.skip_value(0).map_err(bad)?;
    s.finish().map_err(bad)
}

#[cfg(test)]
mod tests;
