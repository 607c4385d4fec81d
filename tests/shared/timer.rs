//! The one benchmark timer, shared by every crate's benchmarks (each includes this file with
//! `#[path]`): the median wall time of a closure, repeated until a budget is spent.
//!
//! Start at `time`.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Median wall time of `f`, repeated until `budget` is spent: at least 3 runs (1 when the
/// budget is under 10 ms, as under `cargo test`), at most `most`.
pub fn time<R>(budget: Duration, most: usize, mut f: impl FnMut() -> R) -> Duration {
    let mut samples = vec![];
    let start = Instant::now();
    let min = if budget < Duration::from_millis(10) { 1 } else { 3 };
    while samples.len() < min || (start.elapsed() < budget && samples.len() < most) {
        let t = Instant::now();
        black_box(f());
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// A duration in milliseconds.
#[allow(dead_code)]
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
