#!/usr/bin/env bash
# Fuzzes every decoder for a bounded time each: ./scripts/fuzz.sh [seconds per target, default 60]
#   ./scripts/fuzz.sh --quick   10 s per target (a smoke run)
# Needs a nightly toolchain and cargo-fuzz (installed here when missing), so it is not part
# of scripts/test.sh: on stable, `cargo test --workspace` replays each target's checks over
# fuzz/seeds, fuzz/regressions and damaged valid inputs (crates/*/tests/fuzz_replay.rs).
# A crash lands in fuzz/artifacts/<target>/; once fixed, copy it to fuzz/regressions/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[ "$secs" = --quick ] && secs=10
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
for t in wire page files config shm; do
    echo "fuzz: $t for ${secs}s"
    # new inputs go to fuzz/corpus/<target> (not checked in); the seeds start it off
    mkdir -p "fuzz/corpus/$t"
    cargo +nightly fuzz run "$t" "$PWD/fuzz/corpus/$t" "$PWD/fuzz/seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048
done
