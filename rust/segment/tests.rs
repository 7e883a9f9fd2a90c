//! Unit tests of the provider response decoder.

use super::*;
use crate::json::unescape;

fn dec(s: &str) -> Result<ResponseIndex, JsonError> {
    decode(s.as_bytes(), &Limits::default())
}

#[test]
fn decodes_the_spec_example() {
    let s = r#"{"segments":[{"type":"text","text":"Sure, let me check."},{"type":"tool_call","toolCall":{"name":"get_weather","args":{"location":"Taipei"}}}]}"#;
    let r = dec(s).unwrap();
    assert_eq!(r.segments.len(), 2);
    assert_eq!(r.segments[0].kind, SegmentType::Text);
    assert_eq!(
        r.segments[0].text.unwrap().as_str(s.as_bytes()),
        "Sure, let me check."
    );
    let call = r.segments[1].tool_call.as_ref().unwrap();
    assert_eq!(call.name.as_str(s.as_bytes()), "get_weather");
    assert!(call.id.is_none());
    let Args::Value((a, b)) = call.args else {
        panic!("args")
    };
    assert_eq!(&s[a..b], r#"{"location":"Taipei"}"#);
}

#[test]
fn parses_args_given_as_a_json_string() {
    let s = r#"{"segments":[{"type":"tool_call","toolCall":{"id":"c1","name":"f","args":"{\"a\": 1}"}}]}"#;
    let r = dec(s).unwrap();
    assert_eq!(
        r.segments[0].tool_call.as_ref().unwrap().args,
        Args::Text("{\"a\": 1}".into())
    );
    let bad = r#"{"segments":[{"type":"tool_call","toolCall":{"name":"f","args":"{oops"}}]}"#;
    assert_eq!(
        dec(bad).unwrap_err().field.as_deref(),
        Some("segments[0].toolCall.args")
    );
}

#[test]
fn enforces_per_type_rules() {
    let cases = [
        (r#"{"segments":[{"type":"text"}]}"#, "segments[0].text"),
        (
            r#"{"segments":[{"type":"text","text":"a"},{"type":"image","mimeType":"image/png"}]}"#,
            "segments[1].data",
        ),
        (
            r#"{"segments":[{"type":"tool_call","toolCall":{"args":{}}}]}"#,
            "segments[0].toolCall.name",
        ),
        (
            r#"{"segments":[{"type":"tool_call"}]}"#,
            "segments[0].toolCall",
        ),
        (r#"{"segments":[{"type":"ui"}]}"#, "segments[0].ui"),
        (
            r#"{"segments":[{"type":"movie","data":"x"}]}"#,
            "segments[0].type",
        ),
        (r#"{"segments":[{"text":"x"}]}"#, "segments[0].type"),
        (r#"{"segments":{}}"#, "segments"),
        (r#"{"metadata":{}}"#, "segments"),
    ];
    for (s, field) in cases {
        let e = dec(s).unwrap_err();
        assert_eq!(e.field.as_deref(), Some(field), "{s}: {e}");
    }
}

#[test]
fn decodes_reasoning_segments() {
    let s = r#"{"segments":[{"type":"reasoning","text":"Think.","signature":"sig=="},{"type":"reasoning","text":"","data":"enc"},{"type":"text","text":"4"}]}"#;
    let r = dec(s).unwrap();
    let b = s.as_bytes();
    assert_eq!(r.segments[0].kind, SegmentType::Reasoning);
    assert_eq!(r.segments[0].text.unwrap().as_str(b), "Think.");
    assert_eq!(r.segments[0].signature.unwrap().as_str(b), "sig==");
    assert_eq!(r.segments[1].text.unwrap().as_str(b), "");
    assert_eq!(r.segments[1].data.unwrap().as_str(b), "enc");
    assert!(r.segments[1].signature.is_none());
    let e = dec(r#"{"segments":[{"type":"reasoning","signature":"s"}]}"#).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("segments[0].text"));
    let e = dec(r#"{"segments":[{"type":"reasoning","text":"a","signature":1}]}"#).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("segments[0].signature"));
}

#[test]
fn keeps_unknown_fields() {
    let s = r#"{"segments":[{"type":"text","text":"a","x":1}],"metadata":{"usage":3},"y":[true]}"#;
    let r = dec(s).unwrap();
    assert_eq!(r.extra.len(), 1);
    assert_eq!(r.segments[0].extra.len(), 1);
    let (a, b) = r.metadata.unwrap();
    assert_eq!(&s[a..b], r#"{"usage":3}"#);
}

#[test]
fn truncation_never_panics() {
    let s = r#"{"segments":[{"type":"tool_call","toolCall":{"id":"1","name":"n","args":"{\"k\":[1]}"}}]}"#;
    for n in 0..s.len() {
        assert!(dec(&s[..n]).is_err());
    }
    assert!(dec(s).is_ok());
    assert_eq!(unescape("{\\\"k\\\":[1]}"), "{\"k\":[1]}");
}
