//! Unit tests of the JSON scanner, the string unescaper and writer, and the error type.

use super::*;

fn ok(s: &str) -> bool {
    validate(s.as_bytes(), &Limits::default()).is_ok()
}

#[test]
fn accepts_valid_documents() {
    for s in [
        "{}",
        "[]",
        "0",
        "-0",
        "1.5e10",
        "-1E-2",
        "\"\"",
        "true",
        "false",
        "null",
        " {\"a\": [1, 2, {\"b\": null}], \"c\": \"\\u00e9\\ud83d\\ude00\\n\"} ",
        "\"caf\u{e9}\"",
    ] {
        assert!(ok(s), "{s}");
    }
}

#[test]
fn rejects_invalid_documents() {
    for s in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "01",
        "1.",
        ".5",
        "1e",
        "-",
        "+1",
        "tru",
        "nul",
        "NaN",
        "Infinity",
        "\"abc",
        "\"\\x\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"a\u{1}b\"",
        "{1:2}",
        "{\"a\" 1}",
        "[1 2]",
        "1 2",
        "{}x",
    ] {
        assert!(!ok(s), "{s:?} should be rejected");
    }
}

#[test]
fn rejects_bom_and_bad_utf8_with_offsets() {
    let e = validate(b"\xEF\xBB\xBF{}", &Limits::default()).unwrap_err();
    assert_eq!(e.offset, Some(0));
    let e = validate(b"{\"a\":\"\xff\"}", &Limits::default()).unwrap_err();
    assert_eq!(e.offset, Some(6));
}

#[test]
fn bounds_depth_and_size() {
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let e = validate(
        deep.as_bytes(),
        &Limits {
            max_bytes: 1 << 30,
            max_depth: 64,
        },
    )
    .unwrap_err();
    assert!(e.message.contains("nesting"), "{e}");
    let ok64 = "[".repeat(64) + &"]".repeat(64);
    assert!(validate(ok64.as_bytes(), &Limits::default()).is_ok());
    let too = "[".repeat(65) + &"]".repeat(65);
    assert!(validate(too.as_bytes(), &Limits::default()).is_err());
    let e = validate(
        b"[1, 2, 3]",
        &Limits {
            max_bytes: 4,
            max_depth: 64,
        },
    )
    .unwrap_err();
    assert!(e.message.contains("exceeds"), "{e}");
}

#[test]
fn integers_are_bounded_like_python_ints() {
    assert!(
        !ok("1e400"),
        "beyond f64: it could not be written back as JSON"
    );
    assert!(ok(&format!("{}.5", "9".repeat(300))));
    assert!(!ok(&format!("{}.5", "9".repeat(400))));
    assert!(ok(&"9".repeat(MAX_INT_DIGITS)));
    assert!(!ok(&"9".repeat(MAX_INT_DIGITS + 1)));
}

#[test]
fn skipping_is_iterative_and_exact() {
    let limits = Limits {
        max_bytes: usize::MAX,
        max_depth: MAX_DEPTH,
    };
    let deep = "[{\"a\":".repeat(255) + "1" + &"}]".repeat(255);
    assert!(validate(deep.as_bytes(), &limits).is_ok());
    let mut s = Scanner::new(b"[1,{\"a\":[]},{}] 7", &limits).unwrap();
    assert_eq!(s.skip_value(0).unwrap(), (0, 15));
    for bad in [
        "[1,]",
        "{\"a\":1,}",
        "[{]",
        "{\"a\" []}",
        "[1 2]",
        "[[]",
        "{\"a\":{}",
    ] {
        assert!(validate(bad.as_bytes(), &limits).is_err(), "{bad}");
    }
}

/// A small xorshift generator: the property tests below are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// `write_str` as it was first written, one byte at a time: the reference.
fn write_str_bytewise(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[test]
fn write_str_escapes_as_a_byte_at_a_time_would_and_reads_back() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pieces = [
        "a",
        "bcdefghij",
        "\"",
        "\\",
        "\n",
        "\r",
        "\t",
        "\u{8}",
        "\u{c}",
        "\u{0}",
        "\u{1f}",
        "\u{7f}",
        "é",
        "東京",
        "😀",
        " ",
        "0123456789abcdef",
    ];
    for _ in 0..20_000 {
        let n = rng.below(12);
        let s: String = (0..n).map(|_| rng.pick(&pieces)).collect();
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        write_str(&mut fast, &s);
        write_str_bytewise(&mut slow, &s);
        assert_eq!(fast, slow, "{s:?}");
        let inner = std::str::from_utf8(&fast[1..fast.len() - 1]).unwrap();
        assert_eq!(unescape(inner), s);
    }
}

/// A random JSON value, valid or nearly so: every construct the scanners
/// know, with whitespace, escapes, UTF-8 and numbers of every shape.
fn random_value(rng: &mut Rng, out: &mut String, depth: usize) {
    const WS: [&str; 5] = ["", "", "", " ", "\n\t "];
    const NUMBERS: [&str; 16] = [
        "0",
        "-0",
        "7",
        "-12",
        "1.5",
        "-0.25",
        "1e5",
        "2E-3",
        "1.5e+300",
        "1e400",
        "01",
        "1.",
        "-",
        "12345678901234567890",
        ".5",
        "0.000001",
    ];
    const STRINGS: [&str; 12] = [
        "\"\"",
        "\"plain\"",
        "\"caf\u{e9}\"",
        "\"\u{1f600} emoji\"",
        "\"esc \\\" \\\\ \\/ \\n\"",
        "\"\\u00e9\\ud83d\\ude00\"",
        "\"\\ud800\"",
        "\"\\x\"",
        "\"a\u{1}b\"",
        "\"unterminated",
        "\"a long string that runs past several words of eight bytes\"",
        "\"\\udc00\"",
    ];
    let ws = rng.pick(&WS);
    out.push_str(ws);
    let choice = if depth > 6 {
        rng.below(4)
    } else {
        rng.below(7)
    };
    match choice {
        0 => out.push_str(rng.pick(&NUMBERS)),
        1 => out.push_str(rng.pick(&STRINGS)),
        2 => out.push_str(rng.pick(&["true", "false", "null", "tru", "nul"])),
        3 => {
            if rng.below(20) == 0 {
                out.push_str(&"9".repeat(250 + rng.below(100)));
            } else {
                out.push_str(rng.pick(&NUMBERS));
            }
        }
        4 | 5 => {
            out.push('{');
            for k in 0..rng.below(5) {
                if k > 0 {
                    out.push_str(rng.pick(&[",", ",", ",", " , ", ""]));
                }
                out.push_str(rng.pick(&WS));
                out.push_str(rng.pick(&["\"k\"", "\"key\\n\"", "\"caf\u{e9}\"", "k"]));
                out.push_str(rng.pick(&[":", " : ", ":", ""]));
                random_value(rng, out, depth + 1);
            }
            out.push_str(rng.pick(&WS));
            out.push_str(rng.pick(&["}", "}", "}", "]", ",}"]));
        }
        _ => {
            out.push('[');
            for k in 0..rng.below(5) {
                if k > 0 {
                    out.push_str(rng.pick(&[",", ",", " ,", ""]));
                }
                random_value(rng, out, depth + 1);
            }
            out.push_str(rng.pick(&WS));
            out.push_str(rng.pick(&["]", "]", "]", "}", ",]"]));
        }
    }
    out.push_str(rng.pick(&WS));
}

/// `skip_value` (fast path, then the checked scanner) against the checked
/// scanner alone: the same result, the same error, the same cursor.
fn same_as_checked(buf: &[u8], depth: usize, limits: &Limits) {
    let Ok(mut fast) = Scanner::new(buf, limits) else {
        return;
    };
    let mut checked = Scanner::new(buf, limits).unwrap();
    let got = fast.skip_value(depth);
    let want = checked.skip_value_checked(depth);
    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(buf));
    assert_eq!(
        fast.pos(),
        checked.pos(),
        "{:?}",
        String::from_utf8_lossy(buf)
    );
    // And the fast path alone never takes what the checked scanner refuses.
    let probe = Scanner::new(buf, limits).unwrap();
    let start = {
        let mut s = Scanner::new(buf, limits).unwrap();
        s.skip_ws();
        s.pos()
    };
    if let Some(end) = probe.skip_fast(start, depth) {
        assert_eq!(want, Ok((start, end)), "{:?}", String::from_utf8_lossy(buf));
    }
}

#[test]
fn fast_skip_matches_the_checked_scanner_on_random_values() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let limits = [
        Limits::default(),
        Limits {
            max_bytes: 1 << 20,
            max_depth: 3,
        },
    ];
    let mut fast_taken = 0;
    for n in 0..60_000 {
        let mut text = String::new();
        random_value(&mut rng, &mut text, 0);
        let l = &limits[n % 2];
        let depth = rng.below(3);
        same_as_checked(text.as_bytes(), depth, l);
        let mut s = Scanner::new(text.as_bytes(), l).unwrap();
        s.skip_ws();
        if s.skip_fast(s.pos(), depth).is_some() {
            fast_taken += 1;
        }
        // The same value, cut short or with one byte changed.
        let mut bytes = text.into_bytes();
        if !bytes.is_empty() {
            let at = rng.below(bytes.len());
            match rng.below(3) {
                0 => bytes.truncate(at),
                1 => bytes[at] = b"{}[]:,\"\\ 0-.eE\x01\x80\xff"[rng.below(17)],
                _ => {
                    bytes.remove(at);
                }
            }
            same_as_checked(&bytes, depth, l);
        }
    }
    // The fast path does take most of the valid values.
    assert!(fast_taken > 5_000, "fast path took only {fast_taken}");
}

#[test]
fn fast_skip_takes_payloads_and_hands_back_the_rest() {
    let limits = Limits::default();
    let fast = |text: &str, depth: usize| {
        let s = Scanner::new(text.as_bytes(), &limits).unwrap();
        s.skip_fast(0, depth)
    };
    let payload = r#"{"toolCallId":"call_1","success":true,"result":{"bytes":512,"truncated":false,"list":[1,-2.5,null,"x",[],{}]},"durationMs":12}"#;
    assert_eq!(fast(payload, 1), Some(payload.len()));
    let spaced = "[ 1 , { \"a\" : [ ] } ]";
    assert_eq!(fast(&format!("{spaced} "), 0), Some(spaced.len()));
    // Left to the checked scanner: exponents, long numbers, deep nesting, errors.
    for (text, depth) in [
        ("1e5", 0),
        (&*"1".repeat(301), 0),
        (&*("[".repeat(65) + &"]".repeat(65)), 0),
        ("[[]]", 63),
        ("[1,]", 0),
        ("{\"a\":01}", 0),
        ("\"\\ud800\"", 0),
    ] {
        assert_eq!(fast(text, depth), None, "{text}");
    }
    // Every depth and nesting limit is the checked scanner's.
    for max_depth in 0..70 {
        let l = Limits {
            max_bytes: 1 << 20,
            max_depth,
        };
        for levels in [0, 1, 2, 63, 64, 65, 66] {
            for depth in [0, 1, 5] {
                let text = "[".repeat(levels) + "{\"a\":[{}]}" + &"]".repeat(levels);
                same_as_checked(text.as_bytes(), depth, &l);
            }
        }
    }
}

#[test]
fn find_special_finds_the_first_byte_that_needs_care() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let alphabet = b"abcdefgh0123456789 -_:{}[],\"\\\x00\x1f\x7f\x80\xc3\xff";
    for _ in 0..20_000 {
        let len = rng.below(48);
        let buf: Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(6) == 0 {
                    alphabet[rng.below(alphabet.len())]
                } else {
                    b'a' + rng.below(26) as u8
                }
            })
            .collect();
        for i in 0..=len {
            let want = (i..len)
                .find(|&j| NEEDS_CARE[buf[j] as usize])
                .unwrap_or(len);
            assert_eq!(find_special(&buf, i), want, "{buf:?} from {i}");
        }
    }
}

#[test]
fn depth_is_capped_whatever_the_limits_say() {
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let e = validate(
        deep.as_bytes(),
        &Limits {
            max_bytes: usize::MAX,
            max_depth: usize::MAX,
        },
    )
    .unwrap_err();
    assert!(e.message.contains("512"), "{e}");
}

#[test]
fn unescape_and_write_round_trip() {
    let samples = [
        "plain",
        "quote \" back \\ slash",
        "ctl \u{1}\u{1f}\n\r\t\u{8}\u{c}",
        "é😀",
    ];
    for s in samples {
        let mut out = Vec::new();
        write_str(&mut out, s);
        let mut sc = Scanner::new(&out, &Limits::default()).unwrap();
        let span = sc.string().unwrap();
        assert_eq!(span.as_str(&out), s);
    }
    assert_eq!(unescape("\\ud83d\\ude00\\u00e9\\/"), "😀é/");
}

#[test]
fn numbers_report_integrality() {
    let mut s = Scanner::new(b"-12", &Limits::default()).unwrap();
    assert_eq!(s.number().unwrap(), (0, 3, true));
    let mut s = Scanner::new(b"2.0", &Limits::default()).unwrap();
    assert_eq!(s.number().unwrap(), (0, 3, false));
    let mut s = Scanner::new(b"2e3", &Limits::default()).unwrap();
    assert!(!s.number().unwrap().2);
    for big in ["1e400", "-1e400", "1.5E+309"] {
        let mut s = Scanner::new(big.as_bytes(), &Limits::default()).unwrap();
        let err = s.number().unwrap_err();
        assert!(err.to_string().contains("out of range"), "{big}: {err}");
    }
    for fine in ["1e308", "1e-400", "-2.5e-10", "0.000001"] {
        let mut s = Scanner::new(fine.as_bytes(), &Limits::default()).unwrap();
        assert!(s.number().is_ok(), "{fine}");
    }
}
