//! The envelope decoder: no panic on any input; a decoded envelope passes the
//! encoder's own header check, and encode → decode → encode gives the same
//! fields, payload and extra fields, byte for byte.
#![no_main]

use _core::envelope::{decode, encode, EnvelopeIndex, Header};
use _core::json::Limits;
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{raw_value, roomy, Value};

/// Encode what `index` found in `buf` again.
fn reencode(buf: &[u8], index: &EnvelopeIndex) -> Vec<u8> {
    let id = index.id.as_str(buf);
    let trace_id = index.trace_id.as_str(buf);
    let source = index.source.as_str(buf);
    let session_id = index.session_id.as_str(buf);
    let type_ = index.type_.as_str(buf);
    let parent = index.parent_id.map(|p| p.as_str(buf));
    let header = Header {
        id: &id,
        timestamp: index.timestamp,
        trace_id: &trace_id,
        source: &source,
        session_id: &session_id,
        priority: index.priority,
        type_: &type_,
        parent_id: parent.as_deref(),
    };
    if let Err(e) = header.validate() {
        panic!("a decoded header fails Header::validate: {e}");
    }
    let keys: Vec<String> = index
        .extra
        .iter()
        .map(|(k, _)| k.as_str(buf).into_owned())
        .collect();
    let extra: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&index.extra)
        .map(|(k, (_, v))| (k.as_str(), v.raw(buf)))
        .collect();
    encode(&header, index.payload.raw(buf), &extra)
}

fn payload(buf: &[u8], index: &EnvelopeIndex, limits: &Limits) -> Value {
    raw_value(buf, (index.payload.start(), index.payload.end()), limits)
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    let Ok(first) = decode(data, &limits) else {
        return;
    };
    let encoded = reencode(data, &first);
    let wide = roomy(&limits);
    let second = match decode(&encoded, &wide) {
        Ok(second) => second,
        Err(e) => panic!(
            "a decoded envelope, encoded again, does not decode: {e}\n{}",
            String::from_utf8_lossy(&encoded)
        ),
    };
    assert_eq!(
        payload(data, &first, &limits),
        payload(&encoded, &second, &wide),
        "the payload changed"
    );
    assert_eq!(
        first.extra.len(),
        second.extra.len(),
        "extra fields changed"
    );
    let again = reencode(&encoded, &second);
    assert_eq!(
        String::from_utf8_lossy(&again),
        String::from_utf8_lossy(&encoded),
        "encode → decode → encode is not stable"
    );
});
