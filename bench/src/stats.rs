//! Latency histograms (HdrHistogram, microseconds, 3 significant digits) and the
//! summaries the bench writes as JSON.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram holds: one hour, in microseconds. Larger values saturate.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Percentiles of the latency curves in the JSON (and the plots).
pub const CURVE_PERCENTILES: &[f64] = &[
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100.0,
];

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

/// Two significant digits: for the many small per-second histograms of a timeline.
pub fn new_coarse_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 2).expect("valid histogram bounds")
}

pub fn record_us(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, LATENCY_US_MAX);
    h.saturating_record(us);
}

#[derive(Serialize, Clone, Debug, Default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub p9999_us: u64,
    pub max_us: u64,
    /// (percentile, microseconds) at `CURVE_PERCENTILES`.
    pub curve: Vec<(f64, u64)>,
}

impl LatencySummary {
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: h.len(),
            mean_us: (h.mean() * 10.0).round() / 10.0,
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            p9999_us: h.value_at_quantile(0.9999),
            max_us: h.max(),
            curve: CURVE_PERCENTILES
                .iter()
                .map(|p| (*p, h.value_at_quantile(p / 100.0)))
                .collect(),
        }
    }
}

/// Per-second counters shared between the worker threads and the progress line.
pub struct Timeline {
    records: Vec<AtomicU64>,
    bytes: Vec<AtomicU64>,
}

impl Timeline {
    pub fn new(seconds: usize) -> Timeline {
        Timeline {
            records: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
            bytes: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn add(&self, at: Duration, records: u64, bytes: u64) {
        let i = (at.as_secs() as usize).min(self.records.len() - 1);
        self.records[i].fetch_add(records, Ordering::Relaxed);
        self.bytes[i].fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn second(&self, i: usize) -> (u64, u64) {
        if i >= self.records.len() {
            return (0, 0);
        }
        (
            self.records[i].load(Ordering::Relaxed),
            self.bytes[i].load(Ordering::Relaxed),
        )
    }

    /// (second, records, bytes) for the first `seconds` seconds.
    pub fn points(&self, seconds: usize) -> Vec<(u64, u64, u64)> {
        (0..seconds.min(self.records.len()))
            .map(|i| {
                let (r, b) = self.second(i);
                (i as u64, r, b)
            })
            .collect()
    }
}
