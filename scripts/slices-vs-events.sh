#!/usr/bin/env bash
# Time slices against events of the same bytes, in the same minutes, with one build or two
# (an A/B): `evb run`, 2 RUs × 2 BUs over tcp, `verify = "headers"`, static content;
# slices of 128 frames of 4 KiB plus one frame of overlap (as `evb bench build`'s slices
# row), events of 512 KiB. Each of SECONDS; ROUNDS rounds, the builds' order reversed every
# other round (ABBA). Prints each run's GB/s built, then per build the median of the rounds'
# slices/events ratios, and with two builds each kind's median ratio B/A.
#
#   scripts/slices-vs-events.sh [ROUNDS] [SECONDS] EVB_A [EVB_B]
set -euo pipefail
rounds=${1:-6}; secs=${2:-4}; a=${3:?the evb binary}; b=${4:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export XDG_STATE_HOME=$tmp/state
common=$'[builder]\nverify = "headers"\nBY\n[transport]\nkind = "tcp"\n[topology]\nrus = 2\nbus = 2\nhost = "127.0.0.1"\n'
head=$'[run]\nid = "ID"\nduration_s = '"$secs"$'\nstall_timeout_s = 20.0\nrate_hz = 0\n'
{
  printf '%s' "${head/ID/slices-vs-events-s}"
  printf '[frames]\nticks = 1000\nsize = 4096\ndistribution = "fixed"\ncontent = "static"\n'
  printf '%s' "${common/BY/by = \"time\"$'\n'slice_ticks = 128000$'\n'overlap_ticks = 1000}"
} > "$tmp/slices.toml"
{
  printf '%s' "${head/ID/slices-vs-events-e}"
  printf '[fragments]\nsize = 524288\ndistribution = "fixed"\ncontent = "static"\n'
  printf '%s' "${common/BY/}"
} > "$tmp/events.toml"
builds=(A); [ -n "$b" ] && builds=(A B)
: > "$tmp/rows"
for r in $(seq 1 "$rounds"); do
  order=("${builds[@]}")
  if [ $((r % 2)) = 0 ] && [ -n "$b" ]; then order=(B A); fi
  for x in "${order[@]}"; do
    bin=$a; [ "$x" = B ] && bin=$b
    for k in slices events; do
      gbs=$("$bin" run --config "$tmp/$k.toml" 2>&1 | sed -n 's/.* \([0-9.]*\) GB\/s built.*/\1/p' | tail -1)
      echo "$r $x $k ${gbs:-0}" | tee -a "$tmp/rows"
    done
  done
done
python3 - "$tmp/rows" <<'PY'
import sys, statistics as st
d = {}
for l in open(sys.argv[1]):
    r, x, k, g = l.split()
    d[(int(r), x, k)] = float(g)
rounds = sorted({r for r, _, _ in d})
builds = sorted({x for _, x, _ in d})
for x in builds:
    q = [d[(r, x, "slices")] / d[(r, x, "events")] for r in rounds if d.get((r, x, "events"))]
    print(f"build {x}: slices/events per round {[round(v, 3) for v in q]}, median {st.median(q):.3f}")
if len(builds) == 2:
    for k in ("slices", "events"):
        q = [d[(r, "B", k)] / d[(r, "A", k)] for r in rounds if d.get((r, "A", k))]
        print(f"{k}: B/A per round {[round(v, 3) for v in q]}, median {st.median(q):.3f}, B faster in {sum(v > 1 for v in q)} of {len(q)}")
PY
