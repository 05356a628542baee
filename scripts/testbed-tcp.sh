#!/usr/bin/env bash
# How TCP recovers on the netns testbed (root): for each shape, unshaped runs with credits
# and random assignment (64 KiB fragments, 4 credits per BU, 100 Mb/s, 4 s), printing the
# bottleneck links' use, the shaped ports' drops and the hosts' TCP counters (segments
# sent again, fast retransmits, timeouts, retransmits refused by the host's own queue).
# These are the figures behind docs/lab/testbed-tcp.md.
#
#   scripts/testbed-tcp.sh                                  # the shapes below, one round
#   SHAPES="4x2:192kb 3x5:96kb 4x4f:256kb" scripts/testbed-tcp.sh   # NxM[f]:queue each
set -euo pipefail
evb=${EVB:-target/release/evb}
secs=${SECONDS_PER_RUN:-4} name=${NAME:-tcpsw}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# congestion control: $(sysctl -n net.ipv4.tcp_congestion_control); $(uname -r)"
for shape in ${SHAPES:-4x2:192kb 2x4:192kb 4x4f:192kb 3x5:96kb 4x4:64kb 4x4:256kb 8x8:256kb}; do
  dims=${shape%%:*} q=${shape#*:} fold=()
  [[ $dims == *f ]] && fold=(--folded) dims=${dims%f}
  n=${dims%x*} m=${dims#*x}
  for a in credits random; do
    printf '[run]\nduration_s = %s\n[fragments]\nsize = 65536\n[builder]\ncredits = 4\nassignment = "%s"\n' "$secs" "$a" > "$work/c.toml"
    out=$("$evb" testbed -q --name "$name" -c "$work/c.toml" --rus "$n" --bus "$m" "${fold[@]}" \
      --rate 100mbit --queue "$q" --duration "$secs" 2>&1 || true)
    echo "$shape $a: $(grep -E 'links \(the bottleneck side\)' <<<"$out" | tail -1 || echo failed)"
    grep -E '^drops at the shaped ports|^TCP in the hosts' <<<"$out" | sed 's/^/    /' || true
  done
done
