#!/usr/bin/env bash
# Two builds' file sinks with and without zstd in the same minutes: per round, for each build,
# `evb run` (its default shape: 2 RUs x 2 BUs over tcp, 1 MiB events, SECONDS long) with
# `compress = "zstd"`, then the plain file sink, into DIR. Prints each run's built GB/s and
# the BUs' CPU seconds per GB, then the medians per build and sink, and each build's median
# ratio of zstd to the plain file sink within a round.
#
#   scripts/zstd-ab.sh EVB_A EVB_B [ROUNDS] [DIR] [SECONDS]
set -euo pipefail
a=${1:?first evb}; b=${2:?second evb}; rounds=${3:-5}; base=${4:-/dev/shm}; secs=${5:-3}
work=$(mktemp -d "$base/evb-zstd-ab.XXXXXX"); conf=$(mktemp -d)
trap 'rm -rf "$work" "$conf"' EXIT
printf '[run]\nduration_s = %s\n[sink]\nkind = "file"\ncompress = "zstd"\ndir = "%s/out"\n' "$secs" "$work" > "$conf/zstd.toml"
printf '[run]\nduration_s = %s\n[sink]\nkind = "file"\ndir = "%s/out"\n' "$secs" "$work" > "$conf/file.toml"
: > "$conf/rates"
for i in $(seq "$rounds"); do
  for evb in "$a" "$b"; do
    for s in zstd file; do
      rm -rf "$work/out"
      "$evb" run --config "$conf/$s.toml" --quiet --json "$conf/s.json" > "$conf/log" 2>&1 || true
      python3 - "$i" "$evb" "$s" "$conf/s.json" "$conf/rates" <<'PY'
import json, os, sys
i, evb, s, summary, rates = sys.argv[1:]
try:
    d = json.load(open(summary))
except (OSError, ValueError):
    print(f"round {i} {evb} {s}: no summary"); sys.exit(0)
r = d["run"]
built = sum((x or {}).get("payload_bytes_built", 0) for x in r["bus"])
bu = sum(n["cpu"]["run_s"] for k, n in d["nodes"].items() if k.startswith("bu"))
gbs, cpu = built / r["seconds"] / 1e9, bu / max(built / 1e9, 1e-9)
print(f"round {i} {evb} {s}: {gbs:.3f} GB/s, BUs {cpu:.3f} CPU s/GB, "
      f"{'OK' if d.get('ok') else 'NOT OK'}, load {os.getloadavg()[0]:.2f}", flush=True)
open(rates, "a").write(f"{i} {evb} {s} {gbs} {cpu}\n")
PY
    done
  done
done
python3 - "$conf/rates" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for i, evb, s, gbs, cpu in rows:
    by.setdefault((evb, s), {})[i] = (float(gbs), float(cpu))
for (evb, s), runs in sorted(by.items()):
    print(f"{evb} {s}: median {st.median(v[0] for v in runs.values()):.3f} GB/s, "
          f"BUs {st.median(v[1] for v in runs.values()):.3f} CPU s/GB")
for evb in sorted({k[0] for k in by}):
    z, f = by.get((evb, "zstd"), {}), by.get((evb, "file"), {})
    r = [z[i][0] / f[i][0] for i in z if i in f and f[i][0] > 0]
    if r:
        print(f"{evb}: zstd / file in the same round, median {st.median(r):.3f}")
PY
