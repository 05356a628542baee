#!/usr/bin/env bash
# The file sink with small events, two builds alternated: `evb run`s of 3 s, 2 RUs x 2 BUs,
# fragments of SIZE bytes (default 256), files of 2048 events (`sink.commit_events`) in
# /dev/shm. Prints each run's events/s (the whole run and its steady state), the BUs' CPU
# microseconds per event and the verdict.
#
#   scripts/sink-small-ab.sh OLD_EVB NEW_EVB [ROUNDS] [SIZE]
set -u
old=$1 new=$2 rounds=${3:-3} size=${4:-256}
w=$(mktemp -d /dev/shm/small-ab.XXXX); c=$(mktemp -d)
printf '[run]\nduration_s = 3\n[fragments]\nsize = %s\n[sink]\nkind = "file"\ndir = "%s/out"\ncommit_events = 2048\n' "$size" "$w" > $c/f.toml
for r in $(seq $rounds); do for b in old new; do
  bin=$old; [ $b = new ] && bin=$new
  rm -rf $w/out
  $bin run --config $c/f.toml --quiet --json $c/s.json >/dev/null 2>&1 || echo "$b failed"
  python3 - $b $c/s.json <<'PY'
import json,sys
d=json.load(open(sys.argv[2])); r=d['run']
ev=sum(b['events_built'] for b in r['bus']); cpu=sum(n['cpu']['run_s'] for k,n in d['nodes'].items() if k.startswith('bu'))
print(f"{sys.argv[1]}: {ev/r['seconds']:.0f} events/s, steady {d.get('steady_events_per_s') or 0:.0f}, BUs {cpu/ev*1e6:.2f} us/event, ok {d['ok']}")
PY
done; done
rm -rf $w $c
