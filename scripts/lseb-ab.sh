#!/usr/bin/env bash
# evb against LSEB on this host (issues 33 and 68), in alternated rounds: each round runs
# LSEB (two nodes, an RU and a BU each, over libfabric's tcp provider), then `evb run` in
# LSEB's folded shape (RU i and BU i on 127.0.0.i+1, shm between them, tcp across), then
# `evb run` plain (2 x 2, all tcp). Static content, headers checked, 8 s runs. Prints each
# round, the medians, the ratios, and MET / not met for issue 68's targets (medians of the
# rounds): at 256 B folded >= 1.3x LSEB's events/s, plain >= 1.2x, and evb's CPU per event
# (all processes) <= 0.8 of LSEB's, folded and plain; at 4 KiB both >= 1.5x.
#
#   scripts/lseb-ab.sh LSEB_BINARY EVB_BINARY [ROUNDS] [FRAGMENT_BYTES]
#
# LSEB is not part of this repository (it has no licence): build it outside, as
# ../shared/FINDINGS.md says. This script only writes its configuration and reads its log.
# Both rates are steady state. LSEB's is the mean of its BUs' "MHz" over their 5 s windows
# after the first, which holds its start (a BU counts fragments, one per RU per event it
# builds: with two nodes, each BU's figure is the events built by both); evb's is `evb run`'s
# `steady_events_per_s` (the BUs' counts from 1 s into the run).
# its CPU is the host's busy time while it runs (it busy-polls; nothing else runs), per
# event at that rate. evb's is its processes' own from the start of the run (`cpu.run_s`).
# FRAGMENT_BYTES (default 256) is evb's payload and LSEB's whole fragment (its 24 B header
# and the rest); LSEB rounds fragments down to 32 B, so give a multiple of 32.
# EVB_PROFILE=1 also samples the whole host (`perf record -a -e cpu-clock`) for 4 s of each
# run's steady state and splits the host's time per event into the kernel's copies
# (`_copy_to_iter`, `_copy_from_iter`: the bytes through the sockets), the rest of the
# kernel, the programs' own code (theirs and their libraries'), and idle: where the gap
# between the two builders lies (needs perf and root).
set -euo pipefail
lseb=$(realpath "${1:?LSEB binary}"); evb=$(realpath "${2:?evb binary}"); rounds=${3:-5}; size=${4:-256}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$lseb" "$evb" "$rounds" "$size" "$tmp" "$(dirname "$(realpath "$0")")" <<'PY'
import json, os, statistics, subprocess, sys, time

lseb, evb, rounds, size, tmp, here = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
PROFILE = os.environ.get("EVB_PROFILE") == "1"
if size % 32 or size < 64:
    sys.exit(f"FRAGMENT_BYTES must be a multiple of 32, at least 64 (got {size})")
DUR = 8

lseb_cfg = {
    "LOG_LEVEL": "INFO",
    "GENERATOR": {"MEAN": str(size - 24), "STD_DEV": "0", "FREQUENCY": "40000000"},
    "GENERAL": {"MAX_FRAGMENT_SIZE": str(-(-size // 24) * 24), "BULKED_EVENTS": "600",
                "CREDITS": "20"},
    "ENDPOINTS": {"node0": {"HOST": "127.0.0.1", "PORT": "7000"},
                  "node1": {"HOST": "127.0.0.1", "PORT": "7001"}},
    "NETWORK": {"IFACE": "lo", "PORT": 7000, "RANGE": 32},
}
with open(f"{tmp}/lseb.json", "w") as f:
    json.dump(lseb_cfg, f)

# evb's runs: the folded 2 x 2 of scripts/folded-2x2.toml at this size and length, and the
# same run, fragments and checks over a plain 2 x 2 (every node on one host, all tcp)
folded = open(os.path.join(here, "folded-2x2.toml")).read()
for key, value in (("duration_s = 4", f"duration_s = {DUR}"), ("size = 256", f"size = {size}")):
    if key not in folded:
        sys.exit(f"scripts/folded-2x2.toml has no `{key}` line to change")
    folded = folded.replace(key, value, 1)
plain = (folded[: folded.index("[transport]")].replace('id = "folded"', 'id = "plain"', 1)
         + "[topology]\nrus = 2\nbus = 2\n")
for name, text in (("folded", folded), ("plain", plain)):
    with open(f"{tmp}/{name}.toml", "w") as f:
        f.write(text)


def busy_seconds():
    """CPU time the host spent busy (all CPUs, /proc/stat): LSEB's processes were seen to
    leave a killed one out of their children's usage now and then."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle, iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


COPIES = {"_copy_to_iter", "_copy_from_iter"}


def start_profile(name):
    """With EVB_PROFILE=1: samples the whole host from 3 s into a run, for 4 s."""
    if not PROFILE:
        return None
    return subprocess.Popen(
        ["bash", "-c", f"sleep 3; exec perf record -q -a -e cpu-clock -F 999 -o {tmp}/{name}.perf"
         " -- sleep 4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def split_profile(prof, name, rate):
    """The host's time per event (us, over all its CPUs) in the profiled window: kernel
    copies, the rest of the kernel, the programs' own code, idle."""
    if prof is None:
        return None
    prof.wait()
    out = subprocess.run(["perf", "report", "-i", f"{tmp}/{name}.perf", "--stdio", "--no-children",
                          "--sort", "comm,dso,sym", "-F", "overhead,comm,dso,sym"],
                         capture_output=True, text=True).stdout
    share = {"copies": 0.0, "kernel": 0.0, "programs": 0.0, "idle": 0.0}
    for line in out.splitlines():
        w = line.split()
        if len(w) < 4 or not w[0].endswith("%"):
            continue
        pct, comm, dso, sym = float(w[0][:-1]), w[1], w[2], w[-1]
        if comm == "swapper":
            share["idle"] += pct
        elif sym in COPIES:
            share["copies"] += pct
        elif dso == "[kernel.kallsyms]":
            share["kernel"] += pct
        else:
            share["programs"] += pct
    cpus = os.cpu_count()
    return {k: v / 100 * cpus / rate for k, v in share.items()}


def show_split(split):
    if split is None:
        return ""
    return " [" + ", ".join(f"{k} {v:.3f}" for k, v in split.items()) + "]"


def run_lseb():
    """LSEB's M events/s, its CPU in microseconds per event, and the profile's split."""
    before = busy_seconds()
    t0 = time.monotonic()
    prof = start_profile("lseb")
    logs, procs = [], []
    for node in ("node0", "node1"):
        log = open(f"{tmp}/{node}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            ["timeout", "-s", "KILL", "13", lseb, "-c", f"{tmp}/lseb.json", "-n", node,
             "-t", "11"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp))  # its log files
    for p in procs:
        p.wait()
    wall = time.monotonic() - t0
    cpu = busy_seconds() - before
    for log in logs:
        log.close()
    rates = []
    for node in ("node0", "node1"):
        windows = []
        for line in open(f"{tmp}/{node}.log", errors="replace"):
            if "Builder Unit:" in line and "MHz" in line:
                w = line.split()
                windows.append(float(w[w.index("MHz") - 1]))
        rates += windows[1:]  # steady state: its first window holds its start
    if not rates:
        for node in ("node0", "node1"):
            print(f"--- LSEB {node}'s log, its end:", file=sys.stderr)
            print("".join(open(f"{tmp}/{node}.log", errors="replace").readlines()[-10:]),
                  file=sys.stderr)
        sys.exit("LSEB printed no rate (its logs' ends are above)")
    rate = statistics.mean(rates)
    split = split_profile(prof, "lseb", rate)
    time.sleep(1)
    return rate, cpu / wall / rate, split


def run_evb(name):
    """evb's M events/s, all its processes' CPU in microseconds per event, and the profile's
    split."""
    out = f"{tmp}/{name}.json"
    if os.path.exists(out):
        os.remove(out)
    prof = start_profile(name)
    done = subprocess.run([evb, "run", "--config", f"{tmp}/{name}.toml", "--quiet", "--json",
                           out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not os.path.exists(out):
        sys.exit(f"evb run ({name}) wrote no summary, exit {done.returncode}:\n{done.stderr[-2000:]}")
    d = json.load(open(out))
    nodes = d["nodes"]
    built = sum(v["stats"]["events_built"] for k, v in nodes.items() if k.startswith("bu"))
    cpu = sum(v["cpu"]["run_s"] for v in nodes.values())  # from the start of the run
    if not d["ok"]:
        print(f"  evb {name}: the run's verdict was not OK", flush=True)
    steady = d.get("steady_events_per_s")
    if steady is None:
        sys.exit(f"evb run ({name}) gave no steady-state rate: an evb older than the script?")
    return steady / 1e6, cpu / built * 1e6, split_profile(prof, name, steady / 1e6)


rows, splits = [], []
print(f"{size} B fragments, {rounds} rounds of LSEB, evb folded, evb plain ({DUR} s each)")
for r in range(1, rounds + 1):
    lr, lc, ls = run_lseb()
    fr, fc, fs = run_evb("folded")
    pr, pc, ps = run_evb("plain")
    rows.append((lr, lc, fr, fc, pr, pc))
    splits.append((ls, fs, ps))
    print(f"round {r} {time.strftime('%H:%M:%S')}: LSEB {lr:.3f} M events/s ({lc:.3f} us/event) | "
          f"evb folded {fr:.3f} ({fc:.3f}) {fr / lr:.2f}x | evb plain {pr:.3f} ({pc:.3f}) "
          f"{pr / lr:.2f}x", flush=True)
    if PROFILE:
        for who, split in zip(("LSEB", "evb folded", "evb plain"), splits[-1]):
            print(f"  host us/event, {who}:{show_split(split)}", flush=True)

med = [statistics.median(c) for c in zip(*rows)]
lr, lc, fr, fc, pr, pc = med
print(f"medians: LSEB {lr:.3f} M events/s, {lc:.3f} us/event | evb folded {fr:.3f}, {fc:.3f} "
      f"| evb plain {pr:.3f}, {pc:.3f}")
print(f"folded/LSEB per round: {sorted(round(row[2] / row[0], 2) for row in rows)}")
print(f"plain/LSEB per round: {sorted(round(row[4] / row[0], 2) for row in rows)}")
if PROFILE:
    for i, who in enumerate(("LSEB", "evb folded", "evb plain")):
        mid = {k: statistics.median(s[i][k] for s in splits) for k in splits[0][i]}
        print(f"host us/event, medians, {who}:{show_split(mid)}")


def verdict(ok):
    return "MET" if ok else "not met"


if size == 256:
    print(f"folded >= 1.3x LSEB: {fr / lr:.2f}x: {verdict(fr / lr >= 1.3)}")
    print(f"plain >= 1.2x LSEB: {pr / lr:.2f}x: {verdict(pr / lr >= 1.2)}")
    for name, c in (("folded", fc), ("plain", pc)):
        print(f"CPU per event <= 0.8 of LSEB's, {name}: {c:.3f} against {lc:.3f} us "
              f"({c / lc:.2f}): {verdict(c <= 0.8 * lc)}")
elif size == 4096:
    print(f"folded >= 1.5x LSEB: {fr / lr:.2f}x: {verdict(fr / lr >= 1.5)}")
    print(f"plain >= 1.5x LSEB: {pr / lr:.2f}x: {verdict(pr / lr >= 1.5)}")
    print(f"CPU per event {fc:.3f} / {pc:.3f} against {lc:.3f} us (report only)")
else:
    print(f"folded {fr / lr:.2f}x, plain {pr / lr:.2f}x LSEB; CPU per event {fc:.3f} / "
          f"{pc:.3f} against {lc:.3f} us (report only)")
PY
