//! Unit tests of the HTTP response decoder, the server-sent events decoder
//! and the chat chunk classifier.

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
    let raw =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
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
    let role =
        r#"{"choices":[{"delta":{"role":"assistant","content":"a","refusal":null}}],"usage":null}"#;
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
