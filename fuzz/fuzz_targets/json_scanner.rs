//! The JSON scanner: any input is accepted or refused without a panic; the
//! tree reader and `validate` agree; an accepted document, re-encoded, parses
//! to the same value and re-encodes to the same bytes.
#![no_main]

use _core::json::{validate, Limits};
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{parse, roomy, to_bytes};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    let tree = parse(data, &limits);
    let valid = validate(data, &limits);
    assert_eq!(
        tree.is_ok(),
        valid.is_ok(),
        "the tree reader and validate disagree: {tree:?} / {valid:?}"
    );
    let Ok(value) = tree else { return };
    let encoded = to_bytes(&value);
    let wide = roomy(&limits);
    if let Err(e) = validate(&encoded, &wide) {
        panic!("the canonical encoding does not validate: {e}");
    }
    let again = match parse(&encoded, &wide) {
        Ok(again) => again,
        Err(e) => panic!("the canonical encoding does not parse: {e}"),
    };
    assert_eq!(again, value, "decode → encode → decode changed the value");
    assert_eq!(to_bytes(&again), encoded, "the encoding is not stable");
});
