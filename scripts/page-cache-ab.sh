#!/usr/bin/env bash
# The file sink with its committed files' pages given back (`sink.keep_in_page_cache =
# false`, the default) and kept (`true`), beside the discard sink, in the same minutes:
# `evb run`'s default shape (2 RUs, 2 BUs, 1 MiB events) for SECONDS each, the three
# alternated ROUNDS times. Prints each run's steady events/s, then the medians and the
# median ratios of the same round. The files go to OUT (default: a folder beside this
# checkout's target/, on its disk: /tmp may be tmpfs, where the setting changes nothing),
# emptied after each run.
#
#   scripts/page-cache-ab.sh [EVB] [ROUNDS] [SECONDS] [OUT]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
evb=${1:-$here/target/release/evb}; rounds=${2:-4}; secs=${3:-12}
out=${4:-$here/target/page-cache-ab}
tmp=$(mktemp -d); trap 'rm -rf "$tmp" "$out"' EXIT
export XDG_STATE_HOME=$tmp/state
for v in drop keep discard; do
  case $v in
    drop) sink=$'kind = "file"\ndir = "'"$out"$'"\nkeep_in_page_cache = false' ;;
    keep) sink=$'kind = "file"\ndir = "'"$out"$'"\nkeep_in_page_cache = true' ;;
    discard) sink='kind = "discard"' ;;
  esac
  printf '[run]\nid = "pc"\nevents = 0\nduration_s = %s\n[sink]\n%s\n' "$secs" "$sink" > "$tmp/$v.toml"
done
steady() { # VARIANT: the run's steady events/s (the BUs' counts from 1 s in)
  rm -rf "$out"
  "$evb" run --quiet --config "$tmp/$1.toml" 2>/dev/null |
    awk '/^VERDICT: OK/ {ok = 1} /steady state/ {r = $(NF - 1)} END {if (ok) print r; else print "FAILED"}'
  rm -rf "$out"
}
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# files in $out ($(df -T "$(dirname "$out")" | awk 'NR == 2 {print $2}'))"
printf '%-6s %10s %10s %10s %8s %8s\n' round drop keep discard drop/keep drop/disc
for r in $(seq "$rounds"); do
  d=$(steady drop); k=$(steady keep); x=$(steady discard)
  awk -v r="$r" -v d="$d" -v k="$k" -v x="$x" \
    'BEGIN {printf "%-6s %10s %10s %10s %8.3f %8.3f\n", r, d, k, x, d / k, d / x}' | tee -a "$tmp/rows"
done
sort_med() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
printf '%-6s %10s %10s %10s %8s %8s\n' median \
  "$(awk '{print $2}' "$tmp/rows" | sort_med)" "$(awk '{print $3}' "$tmp/rows" | sort_med)" \
  "$(awk '{print $4}' "$tmp/rows" | sort_med)" "$(awk '{print $5}' "$tmp/rows" | sort_med)" \
  "$(awk '{print $6}' "$tmp/rows" | sort_med)"
