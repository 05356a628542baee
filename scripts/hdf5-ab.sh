#!/usr/bin/env bash
# The output formats on one filesystem in the same minutes: `evb run` (2 RUs, 2 BUs, generated
# static fragments, `verify = "headers"`, files of COMMIT events each) writing `.evb` files,
# HDF5 in evb's group-per-event layout and HDF5 in the packed layout, alternated ROUNDS
# times. Prints each run's events/s and its files' bytes over the payload they hold (from
# their `.json` metadata), then the medians and each format's median ratio to `.evb` in the
# same round.
#
#   scripts/hdf5-ab.sh EVB [ROUNDS] [FRAGMENT_BYTES] [EVENTS] [COMMIT] [SINKS]
#
# EVB: an evb built with `--features hdf5`. FRAGMENT_BYTES per RU (an event is two: 512 for
# ~1 KB events, 524288 for 1 MiB events). EVENTS per run of `.evb` and packed; the
# group-per-event layout gets a tenth (it is ~30 times slower on small events). SINKS: some
# of evb hdf5-evb hdf5-packed (default all). The files go to $EVB_OUT (default: a temporary
# folder in /tmp), emptied after each run. Ports from 7400 and 7600.
set -euo pipefail
evb=${1:?an evb built with --features hdf5}; rounds=${2:-3}; size=${3:-512}
events=${4:-200000}; commit=${5:-2048}; sinks=${6:-evb hdf5-evb hdf5-packed}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
out=${EVB_OUT:-$tmp/out}
config() { # SINK EVENTS
  local lines
  case $1 in
    evb) lines='kind = "file"' ;;
    hdf5-evb) lines=$'kind = "hdf5"\nhdf5_layout = "evb"' ;;
    hdf5-packed) lines=$'kind = "hdf5"\nhdf5_layout = "packed"' ;;
  esac
  cat > "$tmp/$1.toml" <<TOML
[run]
id = "ab"
events = $2
duration_s = 0
stall_timeout_s = 30.0
[topology]
rus = 2
bus = 2
base_port = 7400
[control]
base_port = 7600
[fragments]
size = $size
content = "static"
[builder]
verify = "headers"
[sink]
$lines
dir = "$out"
commit_events = $commit
TOML
}
for s in $sinks; do
  n=$events; [ "$s" = hdf5-evb ] && n=$((events / 10))
  config "$s" "$n"
done
ratio() { # the files' bytes over their payload, from their metadata
  python3 - "$out" <<'PY'
import json, os, sys
b = p = 0
for n in os.listdir(sys.argv[1]):
    if n.endswith(".json") and not n.startswith(".") and "manifest" not in n:
        m = json.load(open(os.path.join(sys.argv[1], n)))
        b += m["bytes"]; p += m["payload_bytes"]
print(f"{b / p:.3f}" if p else "0")
PY
}
: > "$tmp/results"
for i in $(seq "$rounds"); do
  for s in $sinks; do
    rm -rf "$out"
    "$evb" run --config "$tmp/$s.toml" --quiet > "$tmp/run.log" 2>&1 || true
    rate=$(grep -oE '= [0-9]+ events/s' "$tmp/run.log" | grep -oE '[0-9]+' | tail -1 || true)
    verdict=$(grep -oE 'VERDICT: [A-Z]+' "$tmp/run.log" || echo "no verdict")
    r=$(ratio)
    echo "round $i $s: ${rate:-0} events/s, files ${r} of the payload, $verdict"
    echo "$i $s ${rate:-0} $r" >> "$tmp/results"
  done
done
rm -rf "$out"
python3 - "$tmp/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for i, s, rate, r in rows:
    by.setdefault(s, {})[i] = (float(rate), float(r))
for s, runs in by.items():
    rates = [v[0] for v in runs.values()]
    line = f"{s}: median {statistics.median(rates):.0f} events/s, files " \
           f"{statistics.median(v[1] for v in runs.values()):.3f} of the payload"
    if s != "evb" and "evb" in by:
        ratios = [runs[i][0] / by["evb"][i][0] for i in runs if by["evb"].get(i, (0,))[0] > 0]
        if ratios:
            line += f"; median ratio to .evb in the same round {statistics.median(ratios):.3f} " \
                    f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})"
    print(line)
PY
