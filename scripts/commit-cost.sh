#!/usr/bin/env bash
# The cost of the file sink's commit (docs/protocol.md §6 step 7), against another build in
# the same minutes: alternating `evb run`s of 4 s, 2 RUs x 2 BUs over tcp, file sink into a
# scratch directory, default and tight commit intervals, and the discard sink.
#
#   scripts/commit-cost.sh OLD_EVB NEW_EVB [REPS]
#
# OLD_EVB may be a build that does not know sink.commit_* (before the commit protocol):
# the tight case is then run by NEW_EVB only. Prints one line per run: GB/s built, mean
# build latency, ru0's fragment pool, its high-water mark and the fragments it retained.
set -euo pipefail
old=$1 new=$2 reps=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/file.toml" <<TOML
[run]
duration_s = 4
[sink]
kind = "file"
dir = "$work/out"
TOML
cat > "$work/tight.toml" <<TOML
[run]
duration_s = 4
[sink]
kind = "file"
dir = "$work/out"
commit_events = 4
commit_ms = 20
TOML
printf '[run]\nduration_s = 4\n' > "$work/discard.toml"
one() { # which binary config
  rm -rf "$work/out"
  if ! "$2" run --config "$3" --quiet --json "$work/s.json" > /dev/null 2>&1; then
    echo "$1 $(basename "$3" .toml): run failed"; return
  fi
  python3 - "$1" "$(basename "$3" .toml)" "$work/s.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[3]))
r = d["run"]
built = sum((b or {}).get("payload_bytes_built", 0) for b in r["bus"])
n = sum(b["latency"]["count"] for b in r["bus"])
us = sum(b["latency"]["sum_us"] for b in r["bus"])
ru = d["nodes"]["ru0"]
p = [p for p in ru["pools"] if p["pool"] == "fragments"][0]
mib = p["block_size"] / 2**20
print(f"{sys.argv[1]} {sys.argv[2]}: {built / r['seconds'] / 1e9:.3f} GB/s, build latency "
      f"{us / max(n, 1):.0f} us, ru0 pool {p['blocks'] * mib:.0f} MiB, high water "
      f"{p['high_water'] * mib:.0f} MiB, retained high water {ru['stats']['retained_high_water']}")
PY
}
for _ in $(seq "$reps"); do
  for cfg in file discard; do
    one old "$old" "$work/$cfg.toml"
    one new "$new" "$work/$cfg.toml"
  done
  one new "$new" "$work/tight.toml"
done
