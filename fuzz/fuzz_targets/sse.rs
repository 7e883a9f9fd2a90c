//! The server-sent events decoder: no panic on any input; the same bytes read
//! whole and cut into reads (at points drawn from the input, in reads of a few
//! bytes, and byte by byte when short) give the same events and the same
//! error; no event carries more than `max_event` characters and no line longer
//! than `max_line` characters is accepted; and the events and the error are
//! those of a plain reference reader of the whole input, which keeps the rules
//! of `openstarry.sse` (UTF-8 read with U+FFFD for invalid bytes, lengths in
//! characters of that text, each data line counted with its LF).
#![no_main]

use _core::http::{SseDecoder, SseError, SseEvent};
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{cuts, fnv};

type Outcome = (Vec<SseEvent>, Result<(), SseError>);

fn read(pieces: &[&[u8]], max_line: usize, max_event: usize) -> Outcome {
    let mut d = SseDecoder::new(max_line, max_event);
    let mut events = Vec::new();
    for piece in pieces {
        if let Err(e) = d.feed(piece, &mut events) {
            return (events, Err(e));
        }
    }
    d.close();
    (events, Ok(()))
}

/// Characters, as `openstarry.sse` counts them: of the text the bytes decode to.
fn chars(bytes: &[u8]) -> usize {
    String::from_utf8_lossy(bytes).chars().count()
}

/// The characters of an unfinished line so far: a code point cut at its end is not
/// one yet (a decoder waits for the rest, as Python's incremental decoder does).
fn chars_so_far(bytes: &[u8]) -> usize {
    let mut end = bytes.len();
    if let Err(e) = std::str::from_utf8(bytes) {
        let mut at = e.valid_up_to();
        let mut rest = &bytes[at..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(_) => break,
                Err(e) => match e.error_len() {
                    Some(bad) => {
                        at += e.valid_up_to() + bad;
                        rest = &bytes[at..];
                    }
                    None => {
                        end = at + e.valid_up_to();
                        break;
                    }
                },
            }
        }
    }
    chars(&bytes[..end])
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The lines of `data` (after a byte order mark), and its unfinished last line.
fn lines(data: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut rest = data.strip_prefix(BOM).unwrap_or(data);
    let mut out = Vec::new();
    while let Some(i) = rest.iter().position(|&b| b == b'\r' || b == b'\n') {
        out.push(&rest[..i]);
        rest = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
            &rest[i + 2..]
        } else {
            &rest[i + 1..]
        };
    }
    (out, rest)
}

/// The whole input read by the rules alone.
fn reference(data: &[u8], max_line: usize, max_event: usize) -> Outcome {
    let mut events = Vec::new();
    if data.len() < BOM.len() && BOM.starts_with(data) {
        // Perhaps the start of a byte order mark: held back, nothing read yet.
        return (events, Ok(()));
    }
    let (complete, open) = lines(data);
    let mut event: Option<String> = None;
    let mut lines_of_data: Vec<String> = Vec::new();
    let mut size = 0;
    for raw in complete {
        if chars(raw) > max_line {
            return (events, Err(SseError::Line(max_line)));
        }
        let line = String::from_utf8_lossy(raw);
        if line.is_empty() {
            if !lines_of_data.is_empty() {
                events.push((event.take(), lines_of_data.join("\n")));
                lines_of_data.clear();
            }
            event = None;
            size = 0;
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match name {
            "data" => {
                size += value.chars().count() + 1;
                if size > max_event {
                    return (events, Err(SseError::Event(max_event)));
                }
                lines_of_data.push(value.to_owned());
            }
            "event" => event = (!value.is_empty()).then(|| value.to_owned()),
            _ => {}
        }
    }
    if chars_so_far(open) > max_line {
        return (events, Err(SseError::Line(max_line)));
    }
    (events, Ok(()))
}

fuzz_target!(|data: &[u8]| {
    const BOUNDS: [usize; 9] = [0, 1, 2, 3, 5, 8, 16, 64, 1 << 20];
    let h = fnv(data);
    let max_line = BOUNDS[(h >> 50) as usize % BOUNDS.len()];
    let max_event = BOUNDS[(h >> 54) as usize % BOUNDS.len()];
    let whole = read(&[data], max_line, max_event);
    for (name, text) in &whole.0 {
        let n = text.chars().count();
        assert!(
            n <= max_event,
            "an event of {n} characters passed max_event = {max_event}: {text:?}"
        );
        if let Some(name) = name {
            assert!(chars(name.as_bytes()) <= max_line);
        }
    }
    if whole.1.is_ok() {
        let (complete, open) = lines(data);
        for (line, n) in complete
            .iter()
            .map(|l| (*l, chars(l)))
            .chain([(open, chars_so_far(open))])
        {
            assert!(
                n <= max_line || (data.len() < BOM.len() && BOM.starts_with(data)),
                "a line of {n} characters passed max_line = {max_line}: {:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
    for pieces in cuts(data, 4096, 4096) {
        let split = read(&pieces, max_line, max_event);
        assert_eq!(
            whole,
            split,
            "read whole and in {} reads, the events differ",
            pieces.len()
        );
    }
    assert_eq!(
        whole,
        reference(data, max_line, max_event),
        "the decoder and the reference reader differ (max_line {max_line}, max_event {max_event})"
    );
});
