//! Latency recording in an HDR histogram, and the monotonic clock it reads.
//!
//! A [`LatencyRecorder`] keeps every recorded latency (in nanoseconds) in an
//! [`hdrhistogram::Histogram`]: a fixed memory footprint, constant-time
//! recording, and every percentile within the chosen number of significant
//! figures of the exact one. It is what `openstarry bench latency` records
//! into: [`LatencyRecorder::record_since`] reads the clock and records in one
//! call, so a measurement costs the caller nothing beyond that call.
//!
//! The clock is [`monotonic_ns`]: nanoseconds since a process-wide start,
//! read from [`std::time::Instant`] (`CLOCK_MONOTONIC` on Linux). A caller
//! that stamps the intended time of a measurement reads the same clock, so the
//! two ends of a latency never come from different clocks.

use std::fmt;
use std::sync::OnceLock;
use std::time::Instant;

use hdrhistogram::Histogram;

/// The default highest trackable latency: one hour, in nanoseconds.
pub const DEFAULT_HIGHEST_NS: u64 = 3_600_000_000_000;
/// The default precision: percentiles within 0.1 % of the exact value.
pub const DEFAULT_SIGNIFICANT_FIGURES: u8 = 3;
/// The most significant figures an HDR histogram keeps.
pub const MAX_SIGNIFICANT_FIGURES: u8 = 5;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds on the monotonic clock since the first read in this process.
///
/// It never goes backwards and does not follow changes of the wall clock.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A bad bound or precision for a [`LatencyRecorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LatencyError {
    /// The highest trackable value is below 2 ns.
    Highest(u64),
    /// The significant figures are outside 1..=5.
    SignificantFigures(u8),
    /// A percentile outside 0..=100, or NaN.
    Percentile(String),
}

impl fmt::Display for LatencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LatencyError::Highest(value) => {
                write!(f, "highest_ns must be at least 2, got {value}")
            }
            LatencyError::SignificantFigures(value) => write!(
                f,
                "significant_figures must be 1 to {MAX_SIGNIFICANT_FIGURES}, got {value}"
            ),
            LatencyError::Percentile(value) => {
                write!(f, "percentile must be between 0 and 100, got {value}")
            }
        }
    }
}

impl std::error::Error for LatencyError {}

/// Latencies in nanoseconds, counted in an HDR histogram.
///
/// Values from 0 to `highest_ns` are kept to `significant_figures`
/// significant figures; a larger value is recorded as `highest_ns` and
/// counted in [`saturated`](Self::saturated), so nothing is ever dropped.
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    histogram: Histogram<u64>,
    highest: u64,
    significant_figures: u8,
    saturated: u64,
}

impl LatencyRecorder {
    /// A recorder tracking 0 to `highest_ns` at `significant_figures` (1 to 5).
    pub fn new(highest_ns: u64, significant_figures: u8) -> Result<Self, LatencyError> {
        if highest_ns < 2 {
            return Err(LatencyError::Highest(highest_ns));
        }
        if !(1..=MAX_SIGNIFICANT_FIGURES).contains(&significant_figures) {
            return Err(LatencyError::SignificantFigures(significant_figures));
        }
        // The bounds were checked above, the only errors `new_with_bounds` has.
        let histogram = Histogram::new_with_bounds(1, highest_ns, significant_figures)
            .map_err(|_| LatencyError::Highest(highest_ns))?;
        Ok(LatencyRecorder {
            histogram,
            highest: highest_ns,
            significant_figures,
            saturated: 0,
        })
    }

    /// Record one latency of `ns` nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        if ns > self.highest {
            self.saturated += 1;
        }
        self.histogram.saturating_record(ns.min(self.highest));
    }

    /// Record the time from `intended_ns` (a [`monotonic_ns`] reading) to now;
    /// returns the latency recorded. An `intended_ns` in the future records 0.
    #[inline]
    pub fn record_since(&mut self, intended_ns: u64) -> u64 {
        let latency = monotonic_ns().saturating_sub(intended_ns);
        self.record(latency);
        latency
    }

    /// How many latencies were recorded.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether nothing was recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The latency at `percentile` (0 to 100): the highest value equivalent to
    /// it at the recorder's precision; 0 when nothing was recorded.
    pub fn value_at_percentile(&self, percentile: f64) -> Result<u64, LatencyError> {
        if !(0.0..=100.0).contains(&percentile) {
            return Err(LatencyError::Percentile(percentile.to_string()));
        }
        if self.histogram.is_empty() {
            return Ok(0);
        }
        Ok(self.histogram.value_at_percentile(percentile))
    }

    /// The smallest latency recorded (at the recorder's precision); 0 when empty.
    #[must_use]
    pub fn min(&self) -> u64 {
        if self.histogram.is_empty() {
            0
        } else {
            self.histogram.min()
        }
    }

    /// The largest latency recorded (at the recorder's precision); 0 when empty.
    #[must_use]
    pub fn max(&self) -> u64 {
        if self.histogram.is_empty() {
            0
        } else {
            self.histogram.max()
        }
    }

    /// The mean latency; 0.0 when empty.
    #[must_use]
    pub fn mean(&self) -> f64 {
        self.histogram.mean()
    }

    /// How many latencies were above the highest trackable value.
    #[must_use]
    pub fn saturated(&self) -> u64 {
        self.saturated
    }

    /// The highest trackable latency, in nanoseconds.
    #[must_use]
    pub fn highest_ns(&self) -> u64 {
        self.highest
    }

    /// The precision, in significant figures.
    #[must_use]
    pub fn significant_figures(&self) -> u8 {
        self.significant_figures
    }

    /// Forget every recorded latency.
    pub fn reset(&mut self) {
        self.histogram.reset();
        self.saturated = 0;
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        LatencyRecorder::new(DEFAULT_HIGHEST_NS, DEFAULT_SIGNIFICANT_FIGURES)
            .expect("the default bounds are valid")
    }
}

#[cfg(test)]
mod tests {
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
}
