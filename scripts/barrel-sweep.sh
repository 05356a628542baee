#!/usr/bin/env bash
# The barrel shifter against unshaped assignment, by switch queue depth, on the netns
# testbed (root): N x M at 100 Mb/s, 64 KiB fragments, 4 credits per BU, 4 s runs, the
# configurations alternating in each round. Prints one line per run: queue, assignment,
# shaping, the BU (or bottleneck) links' use as a fraction of the shaped rate, and under the
# barrel shifter how well the RUs kept their slots (the share of slots whose first send came
# more than a tenth of a slot late, the slip's mean and largest).
#
#   scripts/barrel-sweep.sh [ROUNDS] [N] [M]      # default 3 rounds of 4 x 4
#   QUEUES="256kb" scripts/barrel-sweep.sh 1 8 8  # one queue depth only
#   SECONDS_PER_RUN=2 NAME=bs QUEUES="256kb" scripts/barrel-sweep.sh 1 2 2  # the quick mode
#   FOLDED=1 scripts/barrel-sweep.sh 3 4 4          # RU k and BU k on host k (--folded)
#   NIC_QUEUE=8mb scripts/barrel-sweep.sh 3 4 4     # hosts' own ports deep (--host-queue), as
#                                                   # real NICs: only the switch drops
#
# The slot carries exactly one fragment: slot_bytes = 65,576 (64 KiB and its 40-byte
# prefix), its length from link_mbps = 95 (the payload rate TCP/IP leaves of 100 Mb/s).
set -euo pipefail
rounds=${1:-3} n=${2:-4} m=${3:-4}
secs=${SECONDS_PER_RUN:-4} name=${NAME:-bsweep}
evb=${EVB:-target/release/evb}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fold=() shape="${n} x ${m}" nic=() nic_note=""
[ -n "${FOLDED:-}" ] && fold=(--folded) shape="${n} x ${m} folded"
[ -n "${NIC_QUEUE:-}" ] && nic=(--host-queue "$NIC_QUEUE") nic_note="; hosts' queue $NIC_QUEUE"
echo "# congestion control: $(sysctl -n net.ipv4.tcp_congestion_control); $shape at 100 Mb/s$nic_note"
for r in $(seq "$rounds"); do
  for q in ${QUEUES:-64kb 128kb 256kb 1mb}; do
    for case in "credits none" "random none" "credits barrel"; do
      set -- $case
      {
        printf '[run]\nduration_s = %s\n[fragments]\nsize = 65536\n[builder]\ncredits = 4\nassignment = "%s"\n' "$secs" "$1"
        printf '[traffic]\nshaping = "%s"\nslot_bytes = 65576\nlink_mbps = 95\n' "$2"
      } > "$work/c.toml"
      # the testbed's line: "BU links (the bottleneck side): 94.8 % of the shaped rate on average",
      # and under the barrel shifter how well the RUs kept their slots ("RU slots ...: 3.1 %
      # late ...", appended after a "|")
      out=$("$evb" testbed -q --name "$name" -c "$work/c.toml" --rus "$n" --bus "$m" "${fold[@]}" --rate 100mbit \
        --queue "$q" "${nic[@]}" --duration "$secs" 2>&1 || true)
      line=$(grep -E "links \(the bottleneck side\): .* of the shaped rate" <<<"$out" | tail -1 || echo "failed")
      slots=$(grep -E "^RU slots \(barrel shifter\)" <<<"$out" | tail -1 || true)
      echo "round $r queue $q assignment $1 shaping $2: $line${slots:+ | $slots}"
    done
  done
done
