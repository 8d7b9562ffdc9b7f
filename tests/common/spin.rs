//! The output of `spin` (tests/apps/spin.c): progress samples and totals.

/// A finished spin run: (ms since its start, GPU ms done) samples, the
/// GPU time it got and its wall time (ms), and what it printed.
pub struct Spin {
    /// Its start, CLOCK_MONOTONIC ms (its `S` line; 0 where none).
    pub start: f64,
    pub samples: Vec<(f64, f64)>,
    pub busy: f64,
    pub wall: f64,
    pub stdout: String,
}

impl Spin {
    /// Reads spin's `P <ms> <GPU ms>` and `R ... busy_ms=B wall_ms=W` lines.
    pub fn parse(stdout: &str) -> Spin {
        let mut s = Spin {
            start: 0.0,
            samples: Vec::new(),
            busy: 0.0,
            wall: 0.0,
            stdout: stdout.to_string(),
        };
        for l in stdout.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["S", t] => s.start = t.parse().expect("start"),
                ["P", t, b] => s
                    .samples
                    .push((t.parse().expect("t"), b.parse().expect("b"))),
                ["R", _, b, wl] => {
                    s.busy = b.trim_start_matches("busy_ms=").parse().expect("busy");
                    s.wall = wl.trim_start_matches("wall_ms=").parse().expect("wall");
                }
                _ => {}
            }
        }
        s
    }

    /// Percent of the GPU it got over its whole run.
    pub fn fraction(&self) -> f64 {
        100.0 * self.busy / self.wall
    }

    /// `mono_ms` (CLOCK_MONOTONIC ms: another spin's `start`, or a
    /// moment the test took with `cuslice_core::gpu::monotonic_ns`) in ms
    /// of this run.
    pub fn at(&self, mono_ms: f64) -> f64 {
        mono_ms - self.start
    }

    /// Percent of the GPU it got between `from` and `to` ms of its run.
    pub fn fraction_between(&self, from: f64, to: f64) -> f64 {
        let at = |t: f64| {
            self.samples
                .iter()
                .rev()
                .find(|s| s.0 <= t)
                .copied()
                .unwrap_or((0.0, 0.0))
        };
        let (a, b) = (at(from), at(to));
        100.0 * (b.1 - a.1) / (b.0 - a.0).max(1.0)
    }
}
