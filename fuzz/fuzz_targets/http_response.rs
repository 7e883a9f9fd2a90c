//! The HTTP/1.1 response decoder: no panic on any input; the same bytes read
//! whole and cut into reads (at points drawn from the input, and byte by byte
//! when short) give the same progress or error, the same head, the same body
//! and the same surplus; the body never passes its limit, and a body refused
//! for its size keeps exactly the limit's worth; a complete response's body is
//! the bytes after its head that its framing names (a chunked one as a plain
//! de-chunker reads them).
#![no_main]

use _core::http::{Framing, Head, HttpError, Progress, ResponseDecoder};
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{cuts, fnv};

/// Where a read stopped: its progress, or the kind of its error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    At(Progress),
    Protocol,
    TooLarge(u64),
}

fn ended(r: &Result<Progress, HttpError>) -> Ended {
    match r {
        Ok(p) => Ended::At(*p),
        Err(HttpError::Protocol(_)) => Ended::Protocol,
        Err(HttpError::TooLarge(limit)) => Ended::TooLarge(*limit),
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// The last read's progress, or the first read's error (no read after it).
    fed: Ended,
    /// `eof()` after the last read, when no read failed.
    eof: Option<Ended>,
    head: Option<Head>,
    /// Every byte `take_body` gave, in order.
    body: Vec<u8>,
    /// The surplus after the last read, when no read failed.
    surplus: usize,
}

fn read(pieces: &[&[u8]], limit: u64) -> Outcome {
    let mut d = ResponseDecoder::new(limit);
    let mut body = Vec::new();
    let mut fed = Ended::At(d.progress());
    for piece in pieces {
        let r = d.feed(piece);
        body.extend(d.take_body());
        assert!(
            body.len() as u64 <= limit,
            "the body has {} bytes, past its limit of {limit}",
            body.len()
        );
        fed = ended(&r);
        match r {
            Ok(p) => assert_eq!(p, d.progress(), "feed and progress() disagree"),
            Err(HttpError::TooLarge(l)) => {
                assert_eq!(l, limit, "TooLarge names another limit");
                assert_eq!(
                    body.len() as u64,
                    limit,
                    "a body refused for its size does not keep its limit's worth"
                );
                break;
            }
            Err(HttpError::Protocol(_)) => break,
        }
    }
    let failed = !matches!(fed, Ended::At(_));
    let surplus = if failed { 0 } else { d.surplus() };
    if surplus > 0 {
        assert_eq!(d.progress(), Progress::Done, "a surplus before the end");
    }
    let head = d.head().cloned();
    let eof = if failed {
        None
    } else {
        let r = d.eof();
        body.extend(d.take_body());
        if r.is_ok() {
            assert_eq!(d.progress(), Progress::Done, "eof() is Ok but not Done");
        }
        Some(ended(&r))
    };
    assert!(body.len() as u64 <= limit);
    Outcome {
        fed,
        eof,
        head,
        body,
        surplus,
    }
}

/// The length of the final head (after any interim ones): the shortest prefix
/// whose reading leaves the head behind.
fn head_end(data: &[u8], limit: u64) -> usize {
    let (mut lo, mut hi) = (0, data.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let past = !matches!(
            ResponseDecoder::new(limit).feed(&data[..mid]),
            Ok(Progress::Head)
        );
        if past {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// A plain de-chunker, by the chunk-size grammar httparse accepts: up to 16
/// hex digits, blanks, an optional `;` extension of any bytes, CRLF; the data
/// and CRLF (or LF); after the last chunk, trailer lines to an empty one.
/// The body and the bytes used, or `None` if `buf` holds no whole body.
fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &buf[pos..];
        let cr = rest.iter().position(|&b| b == b'\r')?;
        if rest.get(cr + 1) != Some(&b'\n') {
            return None;
        }
        let line = &rest[..cr];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits > 16 {
            return None;
        }
        let mut size: u64 = 0;
        for &b in &line[..digits] {
            size = size * 16 + u64::from((b as char).to_digit(16)?);
        }
        let after = &line[digits..];
        let blanks = after
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        let tail = &after[blanks..];
        if !(tail.is_empty() || tail[0] == b';') {
            return None;
        }
        pos += cr + 2;
        if size == 0 {
            loop {
                let rest = &buf[pos..];
                let lf = rest.iter().position(|&b| b == b'\n')?;
                pos += lf + 1;
                if lf == 0 || (lf == 1 && rest[0] == b'\r') {
                    return Some((body, pos));
                }
            }
        }
        let size = usize::try_from(size).ok()?;
        let data = buf[pos..].get(..size)?;
        body.extend_from_slice(data);
        pos += size;
        let rest = &buf[pos..];
        if rest.starts_with(b"\r\n") {
            pos += 2;
        } else if rest.starts_with(b"\n") {
            pos += 1;
        } else {
            return None;
        }
    }
}

/// A complete response read whole: its body is what its framing says.
fn check_framing(data: &[u8], limit: u64, whole: &Outcome) {
    let done = Ended::At(Progress::Done);
    if whole.fed != done && whole.eof != Some(done) {
        return;
    }
    let head = whole.head.as_ref().expect("Done without a head");
    let start = head_end(data, limit);
    let used = data.len() - whole.surplus;
    assert!(start <= used, "the head ends past the response");
    let framed = &data[start..used];
    match head.framing {
        Framing::Empty | Framing::Length(0) => {
            assert!(whole.body.is_empty(), "a body where the framing has none");
            assert!(framed.is_empty(), "bytes between the head and the surplus");
        }
        Framing::Length(n) => {
            assert_eq!(whole.fed, done, "a length-framed body needs no eof");
            assert_eq!(framed.len() as u64, n, "Content-Length bytes not read");
            assert_eq!(
                whole.body, framed,
                "the body is not the bytes after the head"
            );
        }
        Framing::Close => {
            assert_eq!(whole.surplus, 0);
            assert_eq!(
                whole.body, framed,
                "the body is not the bytes after the head"
            );
        }
        Framing::Chunked => {
            assert_eq!(whole.fed, done, "a chunked body needs no eof");
            match dechunk(&data[start..]) {
                Some((body, n)) => {
                    assert_eq!(whole.body, body, "the de-chunker reads another body");
                    assert_eq!(n, framed.len(), "the de-chunker ends elsewhere");
                }
                None => panic!("the decoder read a chunked body the de-chunker refuses"),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    const LIMITS: [u64; 9] = [0, 1, 2, 5, 16, 100, 1024, 1 << 20, u64::MAX];
    let limit = LIMITS[(fnv(data) >> 50) as usize % LIMITS.len()];
    let whole = read(&[data], limit);
    for pieces in cuts(data, 64, 512) {
        let split = read(&pieces, limit);
        assert_eq!(
            whole,
            split,
            "read whole and in {} reads ({:?}), the response differs",
            pieces.len(),
            pieces.iter().map(|p| p.len()).collect::<Vec<_>>()
        );
    }
    check_framing(data, limit, &whole);
});
