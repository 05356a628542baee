#!/usr/bin/env bash
# `evb sim --model eb` against `evb testbed` on the same configurations: 4 x 4 and 8 x 8,
# plain and folded, 64/128/256 KB switch port queues, credits / random / barrel (64 KiB
# fragments, 4 credits per BU, 100 Mb/s; scripts/barrel-sweep.sh's runs). Prints a Markdown
# table: the testbed's median, the model lossless and with --loss tcp, and the difference
# per row, then the mean and largest differences.
#
#   scripts/sim-vs-testbed.sh [ROUNDS]       # runs the testbed first (root; about 6 min a round)
#   TESTBED=docs/data/testbed-sweep-2026-11-27.txt scripts/sim-vs-testbed.sh   # a saved sweep
#   EVENTS=300 TESTBED=... scripts/sim-vs-testbed.sh                          # the quick mode
#   TESTBED=docs/data/testbed-2026-11-24.txt scripts/sim-vs-testbed.sh       # other shapes, not calibrated on
#   SIM_ARGS="--stall 150 --window 24" TESTBED=... scripts/sim-vs-testbed.sh  # the TCP model's parameters tried
#
# The model in cells of 4 KiB: a fragment is 16 cells, a port queue of 64/128/256 KB is
# 16/32/64 cells. The testbed reports payload over the shaped rate, so the model's link use
# is multiplied by 1448/1514 (a full-sized TCP segment's payload over its Ethernet frame).
# The testbed shapes every host's own port with the same queue, so the TCP model is given
# the hosts' queues too (--host-buffer, the port's cells); HOST_QUEUE=0 leaves them out (the
# model calibrated before 2026-11-28: --burst instead). A sweep whose hosts' ports were deep
# (NIC_QUEUE in barrel-sweep.sh: its header says "hosts' queue") is compared without them.
set -euo pipefail
rounds=${1:-3}
evb=${EVB:-target/release/evb}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
data=${TESTBED:-}
if [ -z "$data" ]; then
  data=$work/testbed.txt
  for r in $(seq "$rounds"); do
    for f in "" 1; do
      for n in 4 8; do
        FOLDED=$f QUEUES="64kb 128kb 256kb" EVB=$evb "$here/barrel-sweep.sh" 1 "$n" "$n" \
          | sed "s/^/F=$f N=$n /" | tee -a "$data" >&2
      done
    done
  done
fi
EVB=$evb EVENTS=${EVENTS:-10000} python3 - "$data" <<'PY'
import os, re, statistics, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

evb, events = os.environ["EVB"], os.environ["EVENTS"]
line = re.compile(r"F=(1?) N=(\d+)(?: M=(\d+))? round \d+ queue (\d+)kb assignment (\w+) "
                  r"shaping (\w+): .*?([\d.]+) % of the shaped rate")
testbed = {}
for text in open(sys.argv[1]):
    m = line.match(text)
    if m:
        f, n, bus, q, a, shaping, v = m.groups()
        key = (bool(f), int(n), int(bus or n), int(q), "barrel" if shaping == "barrel" else a)
        testbed.setdefault(key, []).append(float(v))
if not testbed:
    sys.exit(f"{sys.argv[1]}: no testbed lines")
HEADERS = 1448 / 1514
deep_hosts = "hosts' queue" in open(sys.argv[1]).read()
HOST = os.environ.get("HOST_QUEUE", "0" if deep_hosts else "1") != "0"

def model(key, loss):
    folded, n, bus, q, case = key
    args = [evb, "sim", "--model", "eb", "--n", str(n), "--bus", str(bus), "--credits", "4",
            "--buffer", str(q // 4), "--mean-cells", "16", "--sd-cells", "0",
            "--events", events, "--loss", loss, "--json", "-",
            "--assignment", "random" if case == "random" else "round-robin"]
    if loss == "tcp" and HOST:
        # the testbed shapes both ends of a link with the same queue: the hosts' own too
        args += ["--host-buffer", str(q // 4)]
    if loss == "tcp":
        args += os.environ.get("SIM_ARGS", "").split()
    if folded:
        args.append("--folded")
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    import json
    points = json.loads(out)
    shaping = "barrel" if case == "barrel" else "none"
    p = next(p for p in points if p["model"]["shaping"] == shaping)
    return 100 * p["efficiency"] * HEADERS

keys = sorted(testbed, key=lambda k: k[:4] + (["credits", "random", "barrel"].index(k[4]),))
with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    lossless = list(pool.map(lambda k: model(k, "lossless"), keys))
    tcp = list(pool.map(lambda k: model(k, "tcp"), keys))
print("| configuration | port queue | traffic | testbed (runs) | sim lossless | diff | sim tcp | diff |")
print("|---|---|---|---|---|---|---|---|")
diffs = {"lossless": [], "tcp": [], "tcp unshaped": []}
for k, a, b in zip(keys, lossless, tcp):
    folded, n, bus, q, case = k
    t = statistics.median(testbed[k])
    runs = ", ".join(f"{v:.1f}" for v in testbed[k])
    diffs["lossless"].append(abs(a - t))
    diffs["tcp"].append(abs(b - t))
    if case != "barrel":
        diffs["tcp unshaped"].append(abs(b - t))
    print(f"| {n} x {bus}{' folded' if folded else ''} | {q} KB | {case} | {t:.1f} % ({runs}) "
          f"| {a:.1f} % | {a - t:+.1f} | {b:.1f} % | {b - t:+.1f} |")
for name, d in diffs.items():
    print(f"{name}: mean |diff| {statistics.mean(d):.1f} points, largest {max(d):.1f}, "
          f"within 5 points on {sum(x <= 5 for x in d)} of {len(d)} rows")
PY
