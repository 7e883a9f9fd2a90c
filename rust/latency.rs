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
mod tests;
