//! `DedupWindow::restore`: no panic on any input; a restored window snapshots
//! to the very bytes it came from, restores again to the same window, and
//! keeps working (checks and inserts) afterwards.
#![no_main]

use _core::dedup::DedupWindow;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(window) = DedupWindow::restore(data) else {
        return;
    };
    let snapshot = window.snapshot();
    assert_eq!(
        snapshot.as_slice(),
        data,
        "restore → snapshot changed the bytes"
    );
    let again = match DedupWindow::restore(&snapshot) {
        Ok(again) => again,
        Err(e) => panic!("a snapshot of a restored window does not restore: {e}"),
    };
    assert_eq!(again.len(), window.len());
    assert_eq!(again.window_ms(), window.window_ms());
    assert_eq!(again.max_entries(), window.max_entries());
    assert_eq!(again.snapshot(), snapshot, "the snapshot is not stable");
    let mut window = again;
    let now = 1_764_115_200_000 + window.len() as i64;
    let _ = window.check_and_insert("a-new-id", now);
    let _ = window.expire(now);
    let _ = window.snapshot();
});
