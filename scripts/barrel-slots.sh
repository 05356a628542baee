#!/usr/bin/env bash
# The barrel shifter's slots kept, two builds alternated (or one): `evb run`s of SECS s,
# 2 RUs x 2 BUs over TCP on loopback, 64 KiB fragments, 8 credits per BU, barrel shaping
# with `link_mbps = MBPS` (default 5000: slots of 131,072 bytes are 210 us, shorter than the
# poll's millisecond; `SLOT_BYTES=0` takes evb's default, one fragment with its prefix,
# 65,576 bytes). Prints each run's GB/s built, and per RU the slots it sent in against
# the slots the run held (seconds / slot length), with the share started more than a tenth
# of a slot late though their bytes waited, and the mean slip.
#
#   scripts/barrel-slots.sh NEW_EVB [OLD_EVB] [ROUNDS] [MBPS] [SECS]
set -u
new=$1 old=${2:-} rounds=${3:-3} mbps=${4:-5000} secs=${5:-4}
slot=${SLOT_BYTES:-131072}
c=$(mktemp -d); trap 'rm -rf "$c"' EXIT
printf '[run]\nduration_s = %s\n[fragments]\nsize = 65536\n[builder]\ncredits = 8\n[traffic]\nshaping = "barrel"\nlink_mbps = %s\nslot_bytes = %s\n' "$secs" "$mbps" "$slot" > "$c/b.toml"
[ "$slot" = 0 ] && slot=65576
echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); barrel at link_mbps = $mbps, slot_bytes $slot"
for r in $(seq "$rounds"); do
  for b in ${old:+old} new; do
    bin=$new; [ "$b" = old ] && bin=$old
    "$bin" run --config "$c/b.toml" --quiet --json "$c/s.json" >/dev/null 2>&1 || echo "$b: the run failed"
    python3 - "$b" "$c/s.json" "$mbps" "$slot" <<'PY'
import json, sys
d = json.load(open(sys.argv[2])); r = d['run']; mbps = float(sys.argv[3])
slot_s = float(sys.argv[4]) * 8 / (mbps * 1e6)
held = r['seconds'] / slot_s
built = sum(b['payload_bytes_built'] for b in r['bus']) / r['seconds'] / 1e9
rus = '; '.join(
    f"ru{i} {u.get('barrel_slots', 0)} of {held:.0f} slots ({u.get('barrel_slots', 0) / held:.1%}), "
    f"{u.get('barrel_slots_late', 0) / max(u.get('barrel_slots', 0), 1):.0%} late, slip {u.get('barrel_slip_mean_us', 0)} us"
    for i, u in enumerate(r['rus']))
print(f"{sys.argv[1]}: {built:.3f} GB/s, ok {d['ok']}; {rus}")
PY
  done
done
