#!/usr/bin/env bash
# The barrel shifter on the netns testbed (root), two builds alternated: `evb testbed` runs
# of 4 s, N x M at 100 Mb/s with QUEUE per port, 64 KiB fragments, 4 credits per BU, one
# fragment per slot (slot_bytes = 65576, link_mbps = 95: 5.5 ms slots). Prints each run's
# bottleneck links' use, the RUs' slot timing (a build without it prints none) and the
# packets the switch's ports dropped.
#
#   scripts/barrel-testbed-ab.sh OLD_EVB NEW_EVB [ROUNDS] [N] [M] [QUEUE]
set -u
old=$1 new=$2 rounds=${3:-3} n=${4:-4} m=${5:-4} q=${6:-64kb}
c=$(mktemp -d); trap 'rm -rf "$c"' EXIT
printf '[run]\nduration_s = 4\n[fragments]\nsize = 65536\n[builder]\ncredits = 4\n[traffic]\nshaping = "barrel"\nslot_bytes = 65576\nlink_mbps = 95\n' > "$c/b.toml"
for r in $(seq "$rounds"); do
  for b in old new; do
    bin=$old; [ "$b" = new ] && bin=$new
    out=$("$bin" testbed -q --name bab -c "$c/b.toml" --rus "$n" --bus "$m" --rate 100mbit --queue "$q" --duration 4 2>&1)
    link=$(grep -oE "side\): [0-9.]+ %" <<<"$out" | grep -oE "[0-9.]+" || echo "failed")
    slots=$(grep -E "^RU slots" <<<"$out" | sed -E "s/RU slots \(barrel shifter\): //; s/ started over a tenth of a slot late though their bytes waited//")
    drops=$(grep -oE "the switch.s [0-9]+ \([0-9.]+ %\)" <<<"$out")
    echo "round $r $b ${n}x${m} $q: $link % | ${slots:-no slot counts} | ${drops:-no drop counts} | load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
