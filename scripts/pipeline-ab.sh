#!/usr/bin/env bash
# Two builds of evb alternated on the stream pipeline: each `evb run` with two stream-fed RUs
# and two BUs, fed by that build's own `evb feed` with the recorded CMS files, ROUNDS rounds.
# Prints events/s, the nodes' CPU per event (EVM + RUs + BUs, then each role's: the CPU of
# each process over the events it handled, summed per role) and the verdict of each run.
#
#   scripts/pipeline-ab.sh OLD/target/release/evb NEW/target/release/evb [ROUNDS] [EVENTS] [CONFIGS]
#
# CONFIGS: some of discard-32K, files-32K, discard-default (default all, space-separated).
# The data: $EVB_DATA, else the repository's data/cms. Ports 7301 and 7302.
set -euo pipefail
old=${1:?old evb binary}; new=${2:?new evb binary}; rounds=${3:-3}; events=${4:-600000}
configs=${5:-discard-32K files-32K discard-default}
here=$(cd "$(dirname "$0")/.." && pwd)
data=${EVB_DATA:-$here/data/cms}
a=$data/csc_00307511_EmuRUI01_Local_000.raw; b=$data/csc_00307511_EmuRUI03_Local_000.raw
[ -f "$a" ] && [ -f "$b" ] || { echo "recorded data not found in $data (EVB_DATA)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
config() { # NAME MAX_FRAGMENT_LINE SINK_LINES
  cat > "$tmp/$1.toml" <<TOML
[run]
duration_s = 0
[source]
kind = "stream"
$2
[[ru]]
id = "ru0"
streams = ["127.0.0.1:7301"]
stream_sources = [841]
[[ru]]
id = "ru1"
streams = ["127.0.0.1:7302"]
stream_sources = [843]
[[bu]]
id = "bu0"
[[bu]]
id = "bu1"
[sink]
$3
TOML
}
config discard-32K "max_fragment = 32768" 'kind = "discard"'
config files-32K "max_fragment = 32768" "kind = \"file\"
dir = \"$tmp/out\""
config discard-default "" 'kind = "discard"'
for i in $(seq "$rounds"); do
  for c in $configs; do
    for who in old new; do
      evb=$old; [ "$who" = new ] && evb=$new
      rm -rf "$tmp/out"
      "$evb" run --config "$tmp/$c.toml" --quiet > "$tmp/run.log" 2>/dev/null &
      run=$!
      "$evb" feed --loop --limit "$events" --to 127.0.0.1:7301 --to 127.0.0.1:7302 "$a" "$b" \
        > /dev/null 2>&1 || true
      wait "$run" || true
      rate=$(grep -oE '= [0-9]+ events/s' "$tmp/run.log" | grep -oE '[0-9]+' || echo 0)
      cpu=$(awk '$2=="evm"||$2=="ru"||$2=="bu"{s+=$7} END{print s}' "$tmp/run.log")
      roles=$(awk '$2=="evm"||$2=="ru"||$2=="bu"{s[$2]+=$7} END{printf "EVM %s, RUs %s, BUs %s", s["evm"], s["ru"], s["bu"]}' "$tmp/run.log")
      verdict=$(grep -oE 'VERDICT: [A-Z]+' "$tmp/run.log" || echo "no verdict")
      echo "round $i $c $who: $rate events/s, nodes CPU us/event $cpu ($roles), $verdict"
    done
  done
done
