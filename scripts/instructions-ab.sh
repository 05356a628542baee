#!/usr/bin/env bash
# Instructions per fragment or event of the three per-event stages of a small-event run, for
# two builds, counted by valgrind (cachegrind, no cache simulation): the RU making fragments
# (`ru_runs`), the splitter cutting pages into them (`split_pages`), and the BU's state
# machine filing, building, delivering and releasing events (`bu_pages`). A count does not
# move with the host's load, where timings on this 2-core host scatter by ±15 % from run to
# run; but fewer instructions are not less time where a stage waits on memory (see
# docs/performance.md, "Instructions, and where the BU waits").
#
#   scripts/instructions-ab.sh OLD_TREE NEW_TREE [FRAGMENT_BYTES]
#
# Each tree is a checkout with its examples built:
#   cargo build --release -p evb-builder -p evb-messaging --examples
# Each count is that of a third round less that of a second (start-up and growth left out); it holds
# what a round does untimed too (making the pages that bu_pages files), the same in both
# builds. Needs valgrind (apt-get install valgrind).
set -euo pipefail
old=${1:?old tree}; new=${2:?new tree}; size=${3:-256}
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 1; }

# instructions of running BINARY with ROUNDS rounds
irefs() {
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$1" "$2" "$size" 2>&1 \
    | sed -n 's/.*I *refs: *\([0-9,]*\).*/\1/p' | tr -d ,
}

# instructions per unit of one round: EXAMPLE, PER_ROUND_PASSES, the word before " per "
per_unit() {
  local bin=$1 passes=$2
  local line n one two
  line=$("$bin" 1 "$size" | tail -1)
  n=$(sed -n 's/.*fragments, \([0-9]*\) per .*/\1/p' <<< "$line")
  one=$(irefs "$bin" 2)
  two=$(irefs "$bin" 3)
  python3 -c "print(f'{($two - $one) / ($passes * $n):.0f}')"
}

printf '%-12s %-10s %8s %8s %6s\n' stage per old new new/old
for stage in "ru_runs fragment 400" "split_pages fragment 2000" "bu_pages event 400"; do
  set -- $stage
  a=$(per_unit "$old/target/release/examples/$1" "$3")
  b=$(per_unit "$new/target/release/examples/$1" "$3")
  printf '%-12s %-10s %8s %8s %6s\n' "$1" "$2" "$a" "$b" "$(python3 -c "print(f'{$b / $a:.2f}')")"
done
