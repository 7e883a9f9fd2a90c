//! Unit tests of the event envelope decoder and encoder.

use super::*;

const GOOD: &str = r#"{"id":"5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f","timestamp":1730000000000,"traceId":"t-1","source":"transport-websocket-01","sessionId":"s-1","priority":2,"type":"INPUT:USER_MESSAGE","payload":{"text":"Read the recent system logs","mimeType":"text/plain","metadata":{"platform":"discord"}}}"#;

fn dec(s: &str) -> Result<EnvelopeIndex, JsonError> {
    decode(s.as_bytes(), &Limits::default())
}

#[test]
fn decodes_the_spec_envelope() {
    let idx = dec(GOOD).unwrap();
    let b = GOOD.as_bytes();
    assert_eq!(idx.id.as_str(b), "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f");
    assert_eq!(idx.timestamp, 1_730_000_000_000);
    assert_eq!(idx.trace_id.as_str(b), "t-1");
    assert_eq!(idx.source.as_str(b), "transport-websocket-01");
    assert_eq!(idx.session_id.as_str(b), "s-1");
    assert_eq!(idx.priority, 2);
    assert_eq!(idx.type_.as_str(b), "INPUT:USER_MESSAGE");
    assert!(GOOD[idx.payload.range()].starts_with("{\"text\""));
    assert_eq!(idx.parent_id, None);
    assert!(idx.extra.is_empty());
}

#[test]
fn keeps_unknown_fields_and_parent() {
    let s = GOOD[..GOOD.len() - 1].to_string() + r#","parentId":"p","x-extra":[1,2]}"#;
    let idx = dec(&s).unwrap();
    assert_eq!(idx.parent_id.unwrap().as_str(s.as_bytes()), "p");
    assert_eq!(idx.extra.len(), 1);
    let (k, v) = idx.extra[0];
    assert_eq!(k.as_str(s.as_bytes()), "x-extra");
    assert_eq!(&s[v.range()], "[1,2]");
}

#[test]
fn rejects_bad_priorities() {
    for p in [
        "6", "-1", "\"2\"", "2.5", "2.0", "true", "null", "20", "2e0",
    ] {
        let s = GOOD.replace("\"priority\":2", &format!("\"priority\":{p}"));
        let e = dec(&s).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("priority"), "{p}: {e}");
    }
    for p in 0..=5 {
        let s = GOOD.replace("\"priority\":2", &format!("\"priority\":{p}"));
        assert_eq!(dec(&s).unwrap().priority, p);
    }
}

#[test]
fn rejects_bad_fields() {
    let cases = [
        (
            "\"timestamp\":1730000000000",
            "\"timestamp\":\"1\"",
            "timestamp",
        ),
        (
            "\"timestamp\":1730000000000",
            "\"timestamp\":1.5",
            "timestamp",
        ),
        (
            "\"timestamp\":1730000000000",
            "\"timestamp\":-5",
            "timestamp",
        ),
        ("\"traceId\":\"t-1\"", "\"traceId\":\"\"", "traceId"),
        (
            "\"source\":\"transport-websocket-01\"",
            "\"source\":7",
            "source",
        ),
        ("\"sessionId\":\"s-1\"", "\"sessionId\":null", "sessionId"),
        (
            "\"type\":\"INPUT:USER_MESSAGE\"",
            "\"type\":\"input:user_message\"",
            "type",
        ),
        (
            "\"type\":\"INPUT:USER_MESSAGE\"",
            "\"type\":\"INPUT\"",
            "type",
        ),
        (
            "\"type\":\"INPUT:USER_MESSAGE\"",
            "\"type\":\"INPUT:\"",
            "type",
        ),
        (
            "\"id\":\"5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f\"",
            "\"id\":\"\"",
            "id",
        ),
    ];
    for (from, to, field) in cases {
        let e = dec(&GOOD.replace(from, to)).unwrap_err();
        assert_eq!(e.field.as_deref(), Some(field), "{to}: {e}");
    }
}

#[test]
fn many_unknown_fields_take_linear_time() {
    use std::fmt::Write as _;
    // 100,000 distinct unknown keys, then a repeat of the first: refused.
    // (Comparing every key with every other, as a first version did, made
    // this test run for minutes.)
    let mut s = GOOD[..GOOD.len() - 1].to_string();
    for i in 0..100_000 {
        write!(s, ",\"k{i}\":0").unwrap();
    }
    let limits = Limits {
        max_bytes: 1 << 24,
        max_depth: 64,
    };
    assert_eq!(
        decode(format!("{s}}}").as_bytes(), &limits)
            .unwrap()
            .extra
            .len(),
        100_000
    );
    let e = decode(format!("{s},\"k0\":1}}").as_bytes(), &limits).unwrap_err();
    assert!(e.message.contains("duplicate"), "{e}");
}

#[test]
fn timestamps_read_directly_agree_with_parsing() {
    // The reference: the text parsed as an i64, kept when non-negative.
    for ts in [
        "0",
        "-0",
        "7",
        "1730000000000",
        "999999999999999999",
        "1000000000000000000",
        "9223372036854775807",
        "9223372036854775808",
        "99999999999999999999",
        "-1",
        "-9223372036854775808",
        "1.0",
        "1e3",
    ] {
        let s = GOOD.replace("1730000000000", ts);
        let want = ts.parse::<i64>().ok().filter(|v| *v >= 0);
        match dec(&s) {
            Ok(idx) => assert_eq!(Some(idx.timestamp), want, "{ts}"),
            Err(e) => {
                assert_eq!(want, None, "{ts}: {e}");
                assert_eq!(e.field.as_deref(), Some("timestamp"), "{ts}: {e}");
                assert!(e.message.ends_with(&format!("found {ts}")), "{ts}: {e}");
            }
        }
    }
}

#[test]
fn reports_missing_and_duplicate_fields() {
    let e = dec(&GOOD.replace("\"sessionId\":\"s-1\",", "")).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("sessionId"));
    assert!(e.message.contains("missing"));
    let e = dec(&GOOD.replace(
        "\"sessionId\":\"s-1\",",
        "\"sessionId\":\"s-1\",\"sessionId\":\"s-2\",",
    ))
    .unwrap_err();
    assert!(e.message.contains("duplicate"), "{e}");
}

#[test]
fn truncation_never_panics() {
    for n in 0..GOOD.len() {
        assert!(dec(&GOOD[..n]).is_err());
    }
}

#[test]
fn accepts_every_spec_type_and_custom_types() {
    for t in SPEC_TYPES.iter().chain(&["CUSTOM:THING_2"]) {
        assert!(is_event_type(t), "{t}");
    }
    for t in [
        "", "INPUT", ":X", "X:", "a:B", "A:b", "A:B:C", "A :B", "_A:B", "1A:B",
    ] {
        assert!(!is_event_type(t), "{t}");
    }
}

#[test]
fn the_spec_types_shortcut_agrees_with_the_rule() {
    for t in SPEC_TYPES {
        assert!(is_event_type_bytes(t.as_bytes()), "{t}");
        // The general rule alone (the shortcut skipped): the same answer.
        let mut general = t.as_bytes().to_vec();
        general.push(b'X');
        assert!(is_event_type_bytes(&general), "{t}X");
    }
}

#[test]
fn encode_then_decode_round_trips() {
    let h = Header {
        id: "i\"d",
        timestamp: 42,
        trace_id: "t",
        source: "s",
        session_id: "sess",
        priority: 5,
        type_: "EXEC:TOOL_CALL",
        parent_id: Some("p"),
    };
    h.validate().unwrap();
    let bytes = encode(&h, br#"{"a":[1,2.5,"x"]}"#, &[("extra", b"true")]);
    let idx = decode(&bytes, &Limits::default()).unwrap();
    assert_eq!(idx.id.as_str(&bytes), "i\"d");
    assert_eq!(idx.priority, 5);
    assert_eq!(idx.parent_id.unwrap().as_str(&bytes), "p");
    assert_eq!(&bytes[idx.payload.range()], br#"{"a":[1,2.5,"x"]}"#);
    assert_eq!(idx.extra.len(), 1);
}

#[test]
fn encode_indexed_gives_the_index_decode_reads_from_its_bytes() {
    let strings = [
        "s",
        "default",
        "agent:openstarry",
        "q\"uote",
        "back\\slash",
        "new\nline",
        "東京",
        "😀 x",
        "\u{1}",
        "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f",
    ];
    let payloads: [&[u8]; 4] = [
        b"null",
        br#"{"round":1}"#,
        br#"[1,"x\"y",{"a":{}}]"#,
        b"\"t\"",
    ];
    let mut n = 0usize;
    for (i, &id) in strings.iter().enumerate() {
        for (j, &other) in strings.iter().enumerate() {
            let h = Header {
                id,
                timestamp: (i * 1_000_003 + j) as i64,
                trace_id: other,
                source: strings[(i + j) % strings.len()],
                session_id: strings[(i * 3 + j) % strings.len()],
                priority: ((i + j) % 6) as u8,
                type_: if j % 2 == 0 {
                    "KERNEL:TICK_START"
                } else {
                    "EXEC:TOOL_CALL"
                },
                parent_id: if i % 3 == 0 { None } else { Some(other) },
            };
            h.validate().unwrap();
            let payload = payloads[(i + j) % payloads.len()];
            let (bytes, idx) = encode_indexed(&h, payload);
            assert_eq!(bytes, encode(&h, payload, &[]));
            assert_eq!(idx, decode(&bytes, &Limits::default()).unwrap(), "{h:?}");
            n += 1;
        }
    }
    assert_eq!(n, strings.len() * strings.len());
}

/// Random edits of a valid envelope: every result is an error or an
/// envelope whose spans lie inside the input; nothing panics.
/// The compact fast path takes the envelopes it is for, and whatever it
/// takes the general decoder decodes to the same index; everything it
/// leaves (every invalid envelope among them) keeps the general errors.
#[test]
fn the_compact_path_agrees_with_the_general_decoder() {
    let with_parent = GOOD[..GOOD.len() - 1].to_string() + r#","parentId":"p-1"}"#;
    let zero = GOOD.replace("1730000000000", "0");
    for good in [GOOD, with_parent.as_str(), zero.as_str()] {
        let fast = decode_compact(good.as_bytes(), &Limits::default());
        assert!(fast.is_some(), "{good}");
        assert_eq!(
            fast,
            decode_general(good.as_bytes(), &Limits::default()).ok()
        );
    }
    // Layouts it leaves to the general decoder, which accepts them.
    for other in [
        GOOD.replace(",\"timestamp\"", ", \"timestamp\""),
        GOOD.replace("\"t-1\"", "\"t-\\u0031\""),
        GOOD.replace("\"s-1\"", "\"s-\u{e9}\""),
        GOOD.replace("}}}", "}}} "),
        GOOD[..GOOD.len() - 1].to_string() + r#","x":1}"#,
    ] {
        assert!(decode_compact(other.as_bytes(), &Limits::default()).is_none());
        assert!(
            decode(other.as_bytes(), &Limits::default()).is_ok(),
            "{other}"
        );
    }
    // Limits apply on both paths.
    let small = Limits {
        max_bytes: GOOD.len() - 1,
        ..Limits::default()
    };
    assert!(decode_compact(GOOD.as_bytes(), &small).is_none());
    let shallow = Limits {
        max_depth: 2,
        ..Limits::default()
    };
    assert!(decode_compact(GOOD.as_bytes(), &shallow).is_none());
    assert!(decode(GOOD.as_bytes(), &shallow).is_err());
    // Mutations: one to four bytes changed, inserted or removed.
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let alphabet = b"{}[]:,\"\\ 0123456789-+.eEtrufalsn\x00\x1f\x80\xc3\xa9\xffIA";
    let limits = Limits::default();
    let (mut taken, mut left) = (0, 0);
    for n in 0..60_000 {
        let base = if n % 2 == 0 { GOOD } else { &with_parent };
        let mut buf = base.as_bytes().to_vec();
        for _ in 0..=(next() % 4) {
            let at = (next() as usize) % (buf.len() + 1);
            let byte = alphabet[(next() as usize) % alphabet.len()];
            match next() % 3 {
                0 if at < buf.len() => buf[at] = byte,
                1 if at < buf.len() => {
                    buf.remove(at);
                }
                _ => buf.insert(at, byte),
            }
        }
        match decode_compact(&buf, &limits) {
            Some(fast) => {
                taken += 1;
                assert_eq!(
                    Ok(fast),
                    decode_general(&buf, &limits).map_err(|e| e.to_string()),
                    "{}",
                    String::from_utf8_lossy(&buf)
                );
            }
            None => left += 1,
        }
    }
    // Both paths were exercised.
    assert!(taken > 1_000 && left > 1_000, "{taken} {left}");
}

#[test]
fn mutated_input_never_panics() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let alphabet = b"{}[]:,\"\\ 0123456789-+.eEtrufalsn\x00\x1f\x80\xc3\xa9\xff";
    let limits = Limits::default();
    for _ in 0..50_000 {
        let mut buf = GOOD.as_bytes().to_vec();
        for _ in 0..=(next() % 4) {
            let at = (next() as usize) % (buf.len() + 1);
            let byte = alphabet[(next() as usize) % alphabet.len()];
            match next() % 3 {
                0 if at < buf.len() => buf[at] = byte,
                1 if at < buf.len() => {
                    buf.remove(at);
                }
                _ => buf.insert(at, byte),
            }
        }
        if let Ok(idx) = decode(&buf, &limits) {
            for span in [
                idx.id,
                idx.trace_id,
                idx.source,
                idx.session_id,
                idx.type_,
                idx.payload,
            ] {
                assert!(span.end() <= buf.len() && span.start() <= span.end());
                let _ = span.as_str(&buf);
            }
            assert!(idx.priority <= LOWEST_PRIORITY);
        }
    }
}

#[test]
fn uuids_are_v4() {
    let u = uuid::Uuid::parse_str(&new_uuid()).unwrap();
    assert_eq!(u.get_version_num(), 4);
}
