#!/usr/bin/env bash
# Several rails per host against one, on the netns testbed (root): N x M at 100 Mb/s per
# rail, 64 KiB fragments, 4 s runs, 1 and 2 rails alternating in each round; then one run
# per rail with that rail cut after 2 s. One line per run: rails, the BU links' use as a
# fraction of ONE rail's shaped rate, events/s, the verdict.
#
#   scripts/rails-sweep.sh [ROUNDS] [N] [M]      # default 3 rounds of 2 x 2
#   SECONDS_PER_RUN=3 NAME=rs scripts/rails-sweep.sh 1 2 2   # the quick mode (a test runs it;
#                                                             # the rail is cut halfway)
set -euo pipefail
rounds=${1:-3} n=${2:-2} m=${3:-2}
secs=${SECONDS_PER_RUN:-4} name=${NAME:-rsweep}
evb=${EVB:-target/release/evb}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '[run]\nduration_s = %s\n[fragments]\nsize = 65536\n' "$secs" > "$work/c.toml"
echo "# ${n} x ${m}, every rail 100 Mb/s with 256 KB port queues; congestion control $(sysctl -n net.ipv4.tcp_congestion_control)"
line() {
  local out links rate verdict
  out=$("$evb" testbed -q --name "$name" -c "$work/c.toml" --rus "$n" --bus "$m" --rate 100mbit \
    --duration "$secs" "$@" 2>&1 || true)
  links=$(grep -E "links \(the bottleneck side\)" <<<"$out" | grep -oE "[0-9.]+ %" | tail -1)
  rate=$(grep -oE "= [0-9]+ events/s" <<<"$out" | tail -1)
  verdict=$(grep -oE "VERDICT: [A-Z]+" <<<"$out" | tail -1)
  echo "${links:-failed} ${rate:-} ${verdict:-no verdict}"
}
for r in $(seq "$rounds"); do
  for rails in 1 2; do
    echo "round $r rails $rails: $(line --rails "$rails")"
  done
done
for cut in 0 1; do
  echo "rails 2, rail $cut cut after $((secs / 2)) s: $(line --rails 2 --cut-rail "$cut@$((secs / 2))")"
done
