"""openstarry's benchmarks: each Rust piece beside its pure-Python baselines, in one run."""
