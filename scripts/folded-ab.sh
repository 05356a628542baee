#!/usr/bin/env bash
# Two builds of evb alternated on 256 B events in LSEB's shape (folded 2 x 2: RU i and BU i
# on 127.0.0.i+1, shm between them, tcp across; static content, headers checked, 4 s runs).
# Prints per run: events/s, the BUs' and the RUs' CPU per event built and all five processes'.
# SHAPE `plain` runs the same events as a plain 2 x 2 instead (every node on 127.0.0.1, all
# tcp), as scripts/lseb-ab.sh does.
#
#   scripts/folded-ab.sh OLD/target/release/evb NEW/target/release/evb [ROUNDS] [SHAPE]
set -euo pipefail
old=${1:?old evb binary}; new=${2:?new evb binary}; rounds=${3:-5}; shape=${4:-folded}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
config="$(dirname "$0")/folded-2x2.toml"
if [ "$shape" = plain ]; then
  sed -n '/^\[transport\]/q;p' "$config" | sed 's/^id = "folded"/id = "plain"/' > "$tmp/plain.toml"
  printf '[topology]\nrus = 2\nbus = 2\n' >> "$tmp/plain.toml"
  config="$tmp/plain.toml"
elif [ "$shape" != folded ]; then
  echo "SHAPE is folded or plain, not $shape" >&2; exit 2
fi
for r in $(seq 1 "$rounds"); do
  for b in "$old" "$new"; do
    rm -f "$tmp/s.json"
    "$b" run --config "$config" --quiet --json "$tmp/s.json" > /dev/null 2>&1 || true
    python3 - "$b" "$tmp/s.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
n = d["nodes"]
ev = sum(v["stats"]["events_built"] for k, v in n.items() if k.startswith("bu"))
bu = sum(v["cpu"]["process_s"] for k, v in n.items() if k.startswith("bu"))
ru = sum(v["cpu"]["process_s"] for k, v in n.items() if k.startswith("ru"))
al = sum(v["cpu"]["process_s"] for v in n.values())
print(f"{sys.argv[1]}: {ev / 4.0 / 1e6:.3f} M events/s, BUs {bu / ev * 1e6:.3f} us/event, "
      f"RUs {ru / ev * 1e6:.3f}, all {al / ev * 1e6:.3f} us/event, ok={d['ok']}")
PY
  done
done
