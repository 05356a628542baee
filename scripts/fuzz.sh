#!/usr/bin/env bash
# Fuzzes every decoder for a bounded time each: ./scripts/fuzz.sh [seconds per target, default 60]
# Needs a nightly toolchain and cargo-fuzz (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
for t in wire page files config; do
    echo "fuzz: $t for ${secs}s"
    cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=2048
done
