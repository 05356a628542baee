#!/usr/bin/env bash
# Time slices from live streams against the generator's slices, in the same minutes
# (docs/performance.md, "Building by time"): 2 RUs each reading one front-end stream of 4 KiB
# frames (`evb feed --frames`, on the same host, as fast as the RUs read), cut into slices of
# 100 frames, then the same slices made by the generator (static frames sent by reference).
# Both with builder.verify = "crc" (a live frame's bytes have no pattern to check) and the
# discard sink. Prints each repetition's GB/s and the medians.
#
#   scripts/live-slices.sh [REPS]        # default 3; builds evb --release first
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
cargo build --release -q -p evb
evb=$PWD/target/release/evb
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
base=$((20000 + RANDOM % 20000))
common='[builder]
by = "time"
verify = "crc"
slice_ticks = 1000000
overlap_ticks = 20000
[frames]
ticks = 10000
size = 4096
content = "static"
[sink]
kind = "discard"'
cat > "$dir/live.toml" <<TOML
[run]
id = "live-slices"
duration_s = 0
$common
[source]
kind = "stream"
format = "frames"
max_fragment = 8192
[[ru]]
id = "ru0"
source_id = 0
streams = ["127.0.0.1:$base"]
[[ru]]
id = "ru1"
source_id = 1
streams = ["127.0.0.1:$((base + 1))"]
TOML
cat > "$dir/gen.toml" <<TOML
[run]
id = "gen-slices"
events = 1500
duration_s = 0
[topology]
rus = 2
bus = 2
$common
TOML
rate() { grep -o '[0-9.]* GB/s built' "$1" | cut -d' ' -f1; }
live=(); gen=()
for i in $(seq "$reps"); do
    "$evb" run --config "$dir/live.toml" > "$dir/live.out" 2>&1 &
    run=$!
    "$evb" feed --frames "$dir/live.toml" --to "127.0.0.1:$base" --to "127.0.0.1:$((base + 1))" \
        --limit 150000 > "$dir/feed.out"
    wait "$run"
    "$evb" run --config "$dir/gen.toml" > "$dir/gen.out" 2>&1
    live+=("$(rate "$dir/live.out")"); gen+=("$(rate "$dir/gen.out")")
    echo "rep $i: live ${live[-1]} GB/s, generator ${gen[-1]} GB/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
l=$(median "${live[@]}"); g=$(median "${gen[@]}")
echo "median: live $l GB/s, generator $g GB/s, ratio $(awk -v l="$l" -v g="$g" 'BEGIN {printf "%.2f", l / g}')"
