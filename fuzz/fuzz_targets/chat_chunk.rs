//! The Chat Completions chunk classifier: no panic on any input; a chunk read
//! as text is valid JSON, its text is not empty, and the document, read as a
//! value tree, is what the text fast path promises: an object whose one
//! `choices` is an array of one object (index 0 if any) whose one `delta` is
//! an object whose one `content` is that text; no `refusal`, `tool_calls` or
//! `function_call` but null; no `finish_reason` but null or ""; no `usage` or
//! `error` but null; and `meta` says whether the last `id` and the last
//! `model` are non-empty strings.
#![no_main]

use _core::http::{chat_chunk, ChatChunk};
use _core::json::{validate, Limits, MAX_INPUT};
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{parse, Value};

/// The values of `members` named `key`, in order.
fn all<'a>(members: &'a [(String, Value)], key: &str) -> Vec<&'a Value> {
    members
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

/// The one value named `key`, which must be there exactly once.
fn one<'a>(members: &'a [(String, Value)], key: &str) -> &'a Value {
    match all(members, key).as_slice() {
        [value] => value,
        other => panic!("text from a chunk with {} {key:?} fields", other.len()),
    }
}

fn object(value: &Value, what: &str) -> Vec<(String, Value)> {
    match value {
        Value::Object(members) => members.clone(),
        other => panic!("text from a chunk whose {what} is {other:?}"),
    }
}

fn all_null(members: &[(String, Value)], keys: &[&str]) {
    for key in keys {
        for value in all(members, key) {
            assert_eq!(*value, Value::Null, "text from a chunk with a {key:?}");
        }
    }
}

fn nonempty_string(value: Option<&&Value>) -> bool {
    matches!(value, Some(Value::String(s)) if !s.is_empty())
}

fuzz_target!(|data: &[u8]| {
    let ChatChunk::Text(text, meta) = chat_chunk(data) else {
        return;
    };
    assert!(!text.is_empty(), "ChatChunk::Text with no text");
    let limits = Limits {
        max_bytes: MAX_INPUT,
        max_depth: 64,
    };
    if let Err(e) = validate(data, &limits) {
        panic!("ChatChunk::Text from invalid JSON: {e}");
    }
    let value = match parse(data, &limits) {
        Ok(value) => value,
        Err(e) => panic!("ChatChunk::Text from a document the tree reader refuses: {e}"),
    };
    let top = object(&value, "document");
    all_null(&top, &["usage", "error"]);
    let Value::Array(choices) = one(&top, "choices") else {
        panic!("text from a chunk whose choices is not an array");
    };
    let [choice] = choices.as_slice() else {
        panic!("text from a chunk with {} choices", choices.len());
    };
    let choice = object(choice, "choice");
    for index in all(&choice, "index") {
        assert_eq!(
            *index,
            Value::Number("0".to_owned()),
            "text from a choice whose index is not 0"
        );
    }
    for reason in all(&choice, "finish_reason") {
        assert!(
            matches!(reason, Value::Null) || *reason == Value::String(String::new()),
            "text from a choice with finish_reason {reason:?}"
        );
    }
    let delta = object(one(&choice, "delta"), "delta");
    all_null(&delta, &["refusal", "tool_calls", "function_call"]);
    assert_eq!(
        *one(&delta, "content"),
        Value::String(text.clone()),
        "the text is not the delta's content"
    );
    let want =
        nonempty_string(all(&top, "id").last()) && nonempty_string(all(&top, "model").last());
    assert_eq!(meta, want, "meta is not whether id and model are named");
    assert_eq!(
        chat_chunk(data),
        ChatChunk::Text(text, meta),
        "not deterministic"
    );
});
