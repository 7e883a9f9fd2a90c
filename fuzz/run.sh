#!/usr/bin/env bash
# Run each fuzz target for SECONDS (default 60) on its corpus, one after the
# other: `make fuzz FUZZ_SECONDS=600`. Needs a nightly toolchain and cargo-fuzz
# (rustup toolchain install nightly; cargo install cargo-fuzz). New inputs are
# kept in corpus/<target>/ (ignored by git, except the seed-* files); a crash
# leaves its input in artifacts/<target>/ and stops with a non-zero status.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
targets="${FUZZ_TARGETS:-json_scanner envelope segment dedup_restore http_response sse chat_chunk}"
for target in $targets; do
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
