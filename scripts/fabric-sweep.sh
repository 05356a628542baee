#!/usr/bin/env bash
# Event building through a two-level fabric against one switch, on the netns testbed
# (root): N x N folded (RU k and BU k on host k, as `evb sim --model clos` models it) at
# 100 Mb/s, 64 KiB fragments, 4 credits per BU, 4 s runs; the fabrics and assignments
# alternate in each round. One line per run: the BU links' use as a fraction of the shaped
# rate (the part for the host's own BU left out) and the events built per second.
#
#   scripts/fabric-sweep.sh [ROUNDS] [N] [LEAVES]      # default 3 rounds, 4 x 4 on 2 leaves
#   QUEUES="64kb" scripts/fabric-sweep.sh 1 8 4         # one queue depth only (default 128kb 256kb)
#   SECONDS_PER_RUN=2 NAME=fs QUEUES=256kb FABRICS="one-switch static:1" scripts/fabric-sweep.sh 1 4 2
#                                                       # the quick mode (a test runs it)
#
# Fabrics: one switch; LEAVES leaves and N/LEAVES spines (full bisection) with static
# routing (spine = BU index mod spines) and with hash routing (ECMP per connection); and
# one spine (oversubscribed N/LEAVES : 1). The barrel shifter's slot carries one fragment.
set -euo pipefail
rounds=${1:-3} n=${2:-4} leaves=${3:-2}
secs=${SECONDS_PER_RUN:-4} name=${NAME:-fsweep}
evb=${EVB:-target/release/evb}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
spines=$(( (n + leaves - 1) / leaves ))
echo "# congestion control: $(sysctl -n net.ipv4.tcp_congestion_control); ${n} x ${n} folded at 100 Mb/s, $leaves leaves"
for r in $(seq "$rounds"); do
  for q in ${QUEUES:-128kb 256kb}; do
    for fabric in ${FABRICS:-one-switch static:$spines hash:$spines static:1}; do
      case $fabric in
        one-switch) fargs=() ;;
        *) fargs=(--leaves "$leaves" --routing "${fabric%%:*}" --spines "${fabric##*:}") ;;
      esac
      for case in "credits none" "random none" "credits barrel"; do
        set -- $case
        {
          printf '[run]\nduration_s = %s\n[fragments]\nsize = 65536\n[builder]\ncredits = 4\nassignment = "%s"\n' "$secs" "$1"
          printf '[traffic]\nshaping = "%s"\nslot_bytes = 65576\nlink_mbps = 95\n' "$2"
        } > "$work/c.toml"
        out=$("$evb" testbed -q --name "$name" -c "$work/c.toml" --rus "$n" --bus "$n" --folded \
          --rate 100mbit --queue "$q" --duration "$secs" "${fargs[@]}" 2>&1 || true)
        links=$(grep -E "links \(the bottleneck side\)" <<<"$out" | grep -oE "[0-9.]+ %" | tail -1)
        rate=$(grep -oE "= [0-9]+ events/s" <<<"$out" | tail -1)
        verdict=$(grep -oE "VERDICT: [A-Z]+" <<<"$out" | tail -1)
        echo "round $r queue $q fabric $fabric assignment $1 shaping $2: ${links:-failed} ${rate:-} ${verdict:-no verdict}"
      done
    done
  done
done
