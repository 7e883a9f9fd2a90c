//! Unit tests of the latency recorder.

use super::*;

#[test]
fn percentiles_of_a_uniform_spread_are_within_the_precision() {
    let mut recorder = LatencyRecorder::default();
    for value in 1..=100_000u64 {
        recorder.record(value * 1_000);
    }
    assert_eq!(recorder.len(), 100_000);
    for (percentile, exact) in [
        (50.0, 50_000_000u64),
        (90.0, 90_000_000),
        (99.0, 99_000_000),
        (99.9, 99_900_000),
        (99.99, 99_990_000),
    ] {
        let got = recorder.value_at_percentile(percentile).unwrap();
        let error = got.abs_diff(exact) as f64 / exact as f64;
        assert!(error <= 0.001, "p{percentile}: {got} against {exact}");
    }
    let max = recorder.max();
    assert!(
        max >= 100_000_000 && max.abs_diff(100_000_000) <= 100_000,
        "{max}"
    );
    assert!(
        recorder.min() <= 1_000 && recorder.min() >= 999,
        "{}",
        recorder.min()
    );
    assert!((recorder.mean() - 50_000_500.0).abs() / 50_000_500.0 < 0.001);
}

#[test]
fn one_outlier_shows_in_the_tail_only() {
    let mut recorder = LatencyRecorder::default();
    for _ in 0..9_999 {
        recorder.record(10_000);
    }
    recorder.record(5_000_000_000);
    assert!(recorder.value_at_percentile(99.9).unwrap() < 10_100);
    assert!(recorder.value_at_percentile(100.0).unwrap() >= 5_000_000_000);
    assert!(recorder.max() >= 5_000_000_000);
}

#[test]
fn values_past_the_highest_are_clamped_and_counted() {
    let mut recorder = LatencyRecorder::new(1_000_000, 3).unwrap();
    recorder.record(10);
    recorder.record(u64::MAX);
    recorder.record(2_000_000);
    assert_eq!(recorder.len(), 3);
    assert_eq!(recorder.saturated(), 2);
    assert!(recorder.max() >= 1_000_000 && recorder.max() < 1_001_000);
}

#[test]
fn zero_is_a_value() {
    let mut recorder = LatencyRecorder::default();
    recorder.record(0);
    assert_eq!(recorder.len(), 1);
    assert_eq!(recorder.max(), 0);
    assert_eq!(recorder.value_at_percentile(50.0).unwrap(), 0);
}

#[test]
fn an_empty_recorder_answers_zero() {
    let recorder = LatencyRecorder::default();
    assert!(recorder.is_empty());
    assert_eq!(recorder.value_at_percentile(99.0).unwrap(), 0);
    assert_eq!(recorder.min(), 0);
    assert_eq!(recorder.max(), 0);
    assert!(recorder.mean().abs() < f64::EPSILON);
}

#[test]
fn bad_arguments_are_errors() {
    assert_eq!(
        LatencyRecorder::new(1, 3).unwrap_err(),
        LatencyError::Highest(1)
    );
    assert_eq!(
        LatencyRecorder::new(1_000, 0).unwrap_err(),
        LatencyError::SignificantFigures(0)
    );
    assert_eq!(
        LatencyRecorder::new(1_000, 6).unwrap_err(),
        LatencyError::SignificantFigures(6)
    );
    let recorder = LatencyRecorder::default();
    for bad in [-0.1, 100.5, f64::NAN] {
        assert!(recorder.value_at_percentile(bad).is_err(), "{bad}");
    }
    assert_eq!(
        LatencyError::SignificantFigures(9).to_string(),
        "significant_figures must be 1 to 5, got 9"
    );
}

#[test]
fn record_since_measures_from_the_intended_time_on_the_same_clock() {
    let mut recorder = LatencyRecorder::default();
    let intended = monotonic_ns();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let latency = recorder.record_since(intended);
    assert!(latency >= 2_000_000, "{latency}");
    assert_eq!(recorder.len(), 1);
    // An intended time still to come is no latency at all.
    assert_eq!(recorder.record_since(monotonic_ns() + 60_000_000_000), 0);
    assert_eq!(recorder.len(), 2);
}

#[test]
fn the_clock_never_goes_backwards() {
    let mut last = monotonic_ns();
    for _ in 0..10_000 {
        let now = monotonic_ns();
        assert!(now >= last);
        last = now;
    }
}

#[test]
fn reset_forgets_everything() {
    let mut recorder = LatencyRecorder::new(1_000, 2).unwrap();
    recorder.record(5_000);
    recorder.reset();
    assert!(recorder.is_empty());
    assert_eq!(recorder.saturated(), 0);
    assert_eq!(recorder.highest_ns(), 1_000);
    assert_eq!(recorder.significant_figures(), 2);
}
