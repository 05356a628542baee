#!/usr/bin/env bash
# The wall time of a whole `evb run` with the file sink, from the command's start to its
# verdict (the post-run checks included), for one build or two alternated: the default
# shape (2 RUs, 2 BUs, 1 MiB events) for SECONDS, files into OUT (default /dev/shm, emptied
# before each run), ROUNDS rounds. Prints each run's seconds, bytes written and verdict.
#
#   scripts/file-run-time.sh [ROUNDS] [SECONDS] EVB_A [EVB_B] [OUT]
set -euo pipefail
rounds=${1:-3}; secs=${2:-4}; a=${3:?the evb binary}; b=${4:-}
out=${5:-/dev/shm/evb-file-run-time}
tmp=$(mktemp -d); trap 'rm -rf "$tmp" "$out"' EXIT
export XDG_STATE_HOME=$tmp/state
printf '[run]\nid = "file-run-time"\nduration_s = %s\n\n[sink]\nkind = "file"\ndir = "%s"\n' \
  "$secs" "$out" > "$tmp/run.toml"
for r in $(seq 1 "$rounds"); do
  for x in A B; do
    bin=$a; [ "$x" = B ] && bin=$b
    [ -n "$bin" ] || continue
    rm -rf "$out"
    s=$(date +%s.%N)
    "$bin" run --config "$tmp/run.toml" > "$tmp/log" 2>&1 || true
    e=$(date +%s.%N)
    bytes=$(du -sb "$out" 2>/dev/null | cut -f1)
    verdict=$(grep -o 'VERDICT: [A-Z]*' "$tmp/log" || echo 'VERDICT: none')
    printf '%s %s %.2f s, %s MB written, %s\n' "$r" "$x" "$(echo "$e - $s" | bc)" \
      "$(( ${bytes:-0} / 1000000 ))" "$verdict"
  done
done
