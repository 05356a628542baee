#!/usr/bin/env bash
# Does evb's small-event rate depend on what ran before it? Runs of docs/performance.md's
# small.toml (2 RUs x 2 BUs, 256 B static fragments, headers checked, 4 s), back to back,
# then after an idle pause, then back to back again. One line per run: events/s, the CPU
# seconds of all five processes over the run and per event, the BUs' mean build latency,
# what the host did meanwhile (CPU stolen by the hypervisor, the DAMON thread's CPU), and a
# probe run right after it: a fixed pure-CPU loop on both cores at once, in seconds (no
# memory, no system calls: if it slows down with evb, the host's CPUs slowed down).
#
#   scripts/drift.sh [EVB] [RUNS] [IDLE_S]     # defaults: target/release/evb 6 150
#   scripts/drift.sh --host                    # the host alone, no evb: the CPU probe every
#                                              # 5 s for 2 minutes, then 60 s of a copy loop
#                                              # (two processes, 64 MiB buffers) in 4 s windows
set -euo pipefail
if [ "${1:-}" = "--host" ]; then
  host_only=1
  shift
fi
evb=${1:-target/release/evb} runs=${2:-6} idle=${3:-150}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/small.toml" <<'TOML'
[run]
id = "small"
duration_s = 4
stall_timeout_s = 20
[fragments]
size = 256
distribution = "fixed"
content = "static"
[builder]
verify = "headers"
[topology]
rus = 2
bus = 2
TOML
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
damon_ticks() {
  local p
  p=$(pgrep -x kdamond.0 || true)
  if [ -n "$p" ]; then awk '{print $14+$15}' "/proc/$p/stat"; else echo 0; fi
}
probe() {
  python3 - <<'PY'
import multiprocessing as mp, time
def spin(_):
    t = time.perf_counter(); s = 0
    for i in range(3_000_000):
        s += i * i
    return time.perf_counter() - t
with mp.Pool(2) as p:
    print(f"{max(p.map(spin, [0, 1])):.3f}")
PY
}
one() { # label
  read -r s0 t0 < <(steal)
  d0=$(damon_ticks)
  "$evb" run --config "$work/small.toml" --quiet --json "$work/s.json" > /dev/null 2>&1 || {
    echo "$1: run failed"; return; }
  read -r s1 t1 < <(steal)
  d1=$(damon_ticks)
  p=$(probe)
  python3 - "$1" "$work/s.json" "$((s1 - s0))" "$((t1 - t0))" "$((d1 - d0))" "$p" <<'PY'
import json, sys
label, path = sys.argv[1], sys.argv[2]
st, tot, damon = map(int, sys.argv[3:6])
probe = sys.argv[6]
d = json.load(open(path))
r = d["run"]
ev = r["evm"]["released"]
cpu = sum((n.get("cpu") or {}).get("run_s") or 0 for n in d["nodes"].values())
n = sum(b["latency"]["count"] for b in r["bus"])
us = sum(b["latency"]["sum_us"] for b in r["bus"])
print(f"{label}: {ev / r['seconds'] / 1e6:.2f} M events/s, CPU {cpu:.1f} s "
      f"({cpu / max(ev, 1) * 1e6:.2f} us/event), build latency {us / max(n, 1):.0f} us, "
      f"steal {100 * st / max(tot, 1):.1f} %, kdamond {damon} ticks, CPU probe {probe} s")
PY
}
if [ -n "${host_only:-}" ]; then
  printf 'CPU probe alone (s):'
  for _ in $(seq 24); do printf ' %s' "$(probe)"; sleep 5; done
  echo
  python3 - <<'PY'
import multiprocessing as mp, time
def copy(q):
    src = bytearray(64 << 20); dst = bytearray(64 << 20)
    out = []; t0 = time.perf_counter(); w = t0 + 4; n = 0
    while True:
        dst[:] = src; n += 1
        now = time.perf_counter()
        if now >= w:
            out.append(n * 64 / 1024 / 4); n = 0; w += 4
            if now >= t0 + 60:
                break
    q.put(out)
q = mp.Queue(); ps = [mp.Process(target=copy, args=(q,)) for _ in range(2)]
[p.start() for p in ps]; r = [q.get() for _ in ps]; [p.join() for p in ps]
print("copy loop alone, GiB/s in 4 s windows:", " ".join(f"{a + b:.1f}" for a, b in zip(*r)))
PY
  exit 0
fi
echo "CPU probe before: $(probe) s"
for k in $(seq "$runs"); do one "back to back $k"; done
echo "idle ${idle} s"
sleep "$idle"
echo "CPU probe after the idle time: $(probe) s"
for k in $(seq "$runs"); do one "after idle $k"; done
