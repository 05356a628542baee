#!/usr/bin/env bash
# A row per sink beside two references of the same minutes: the discard sink (the build
# limit) and a plain writer of the same bytes into the same filesystem, in the same part
# sizes, with the same syncs (the write limit). Each round runs, in turn, `evb run` with the
# discard sink, then per sink in SINKS `evb run` writing into DIR and the plain writer.
# Default shape: 2 RUs x 2 BUs over tcp, 1 MiB events (`evb run`'s own), SECONDS long.
#
#   scripts/sink-bench.sh EVB [ROUNDS] [DIR] [SECONDS]
#
# DIR: a folder on the filesystem to measure (default /dev/shm; a fresh folder is made in it
# and removed). SINKS (environment): some of `file file-zstd` (default `file`). OLD
# (environment): another build, whose file sink runs in each round too (`file-old`), to
# compare builds in the same minutes.
# The plain writer: for each BU a thread that writes files of the sink's mean file size in
# 1 MiB writes from memory, then does what a file's commit does: fdatasync, a metadata file
# written and fdatasync'd, two renames, the directory synced. Prints each run, then the
# medians and the ratios of each round's figures (medians of the rounds' ratios). CPU per GB
# holds better than GB/s on a busy host: each run also gives its BUs' CPU seconds per GB
# (the plain writer: its own), and the summary the sink's cost over discard's beside the
# plain writer's.
set -euo pipefail
evb=${1:?evb binary}; rounds=${2:-3}; base=${3:-/dev/shm}; secs=${4:-3}
sinks=${SINKS:-file}
work=$(mktemp -d "$base/evb-sink-bench.XXXXXX")
conf=$(mktemp -d)
trap 'rm -rf "$work" "$conf"' EXIT
printf '[run]\nduration_s = %s\n' "$secs" > "$conf/discard.toml"
for s in $sinks; do
  { printf '[run]\nduration_s = %s\n[sink]\nkind = "file"\ndir = "%s/out"\n' "$secs" "$work"
    [ "$s" = file-zstd ] && printf 'compress = "zstd"\n'; } > "$conf/$s.toml"
done
rates=$conf/rates
: > "$rates"
# one `evb run`: prints and records GB/s of payload built, and the files' count and bytes
run() { # ROUND NAME [BINARY CONFIG]
  rm -rf "$work/out"
  if ! "${3:-$evb}" run --config "$conf/${4:-$2}.toml" --quiet --json "$conf/s.json" > "$conf/log" 2>&1; then
    echo "round $1 $2: run failed"; tail -5 "$conf/log"; return 1
  fi
  python3 - "$1" "$2" "$conf/s.json" "$work/out" "$rates" <<'PY'
import json, os, sys
rnd, name, summary, out, rates = sys.argv[1:]
d = json.load(open(summary))
r = d["run"]
built = sum((b or {}).get("payload_bytes_built", 0) for b in r["bus"])
gbs = built / r["seconds"] / 1e9
bu_cpu = sum(n["cpu"]["run_s"] for k, n in d["nodes"].items() if k.startswith("bu"))
cpu_gb = bu_cpu / (built / 1e9)
files = [os.path.join(out, f) for f in os.listdir(out)] if os.path.isdir(out) else []
data = [f for f in files if f.endswith(".evb")]
size = sum(os.path.getsize(f) for f in data)
print(f"round {rnd} {name}: {gbs:.3f} GB/s, BUs {cpu_gb:.3f} CPU s/GB, "
      f"{'OK' if d.get('ok') else 'NOT OK'}, {len(data)} files, {size / 1e9:.2f} GB")
with open(rates, "a") as f:
    f.write(f"{rnd} {name} {gbs} {len(data)} {size} {cpu_gb}\n")
PY
}
# the plain writer of the bytes the last file run wrote, in files of their mean size
plain() { # ROUND SINK
  read -r files bytes < <(awk -v r="$1" -v s="$2" '$1 == r && $2 == s {print $4, $5}' "$rates")
  [ "${files:-0}" -gt 0 ] || { echo "round $1 $2 wrote no file"; return 1; }
  rm -rf "$work/out"
  python3 - "$1" "$2" "$work/out" "$files" "$bytes" "$rates" <<'PY'
import os, resource, sys, threading, time
rnd, sink, out, files, total, rates = sys.argv[1:]
files, total = int(files), int(total)
os.makedirs(out)
part = max(total // max(files, 1), 1)
block = os.urandom(1 << 20)
def writer(w, nfiles):
    d = os.open(out, os.O_RDONLY)
    for k in range(nfiles):
        name = f"r_bu{w}_{k:06}.evb"
        tmp = os.path.join(out, "." + name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = part
        while left:
            left -= os.write(fd, block[:min(left, len(block))])
        os.fdatasync(fd)
        meta = tmp[:-4] + ".json.tmp"
        m = os.open(meta, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(m, b'{"format": "evb-events"}\n' * 20)
        os.fdatasync(m)
        os.close(m)
        os.close(fd)
        os.rename(tmp, os.path.join(out, name))
        os.rename(meta, os.path.join(out, name + ".json"))
        os.fsync(d)
    os.close(d)
per = [files // 2 + (w < files % 2) for w in range(2)]
u0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
ts = [threading.Thread(target=writer, args=(w, n)) for w, n in enumerate(per)]
for x in ts: x.start()
for x in ts: x.join()
dt = time.perf_counter() - t
u1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
gbs = part * files / dt / 1e9
cpu_gb = cpu / (part * files / 1e9)
print(f"round {rnd} plain writer ({sink}'s {files} files of {part / 1e6:.1f} MB): "
      f"{gbs:.3f} GB/s, {cpu_gb:.3f} CPU s/GB")
with open(rates, "a") as f:
    f.write(f"{rnd} plain-{sink} {gbs} {files} {part * files} {cpu_gb}\n")
PY
}
for k in $(seq "$rounds"); do
  run "$k" discard
  for s in $sinks; do
    run "$k" "$s" && plain "$k" "$s"
  done
  if [ -n "${OLD:-}" ]; then run "$k" file-old "$OLD" file; fi
done
python3 - "$rates" "$sinks" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
by, cpu = {}, {}
for rnd, name, gbs, _files, _bytes, cpu_gb in rows:
    by.setdefault(name, {})[rnd] = float(gbs)
    cpu.setdefault(name, {})[rnd] = float(cpu_gb)
med = lambda xs: st.median(xs) if xs else float("nan")
print("medians: " + ", ".join(f"{n} {med(list(v.values())):.3f} GB/s" for n, v in by.items()))
if "file-old" in by and "file" in by:
    r = [by["file"][k] / by["file-old"][k] for k in by["file"] if k in by["file-old"]]
    print(f"file / file-old: {med(r):.3f} (rounds {', '.join(f'{x:.2f}' for x in r)})")
for s in sys.argv[2].split():
    sink, pl, dis = by.get(s, {}), by.get("plain-" + s, {}), by.get("discard", {})
    of_plain = [sink[r] / pl[r] for r in sink if r in pl]
    of_dis = [sink[r] / dis[r] for r in sink if r in dis]
    print(f"{s}: {med(of_plain):.3f} of the plain writer (rounds "
          f"{', '.join(f'{x:.2f}' for x in of_plain)}), {med(of_dis):.3f} of discard (rounds "
          f"{', '.join(f'{x:.2f}' for x in of_dis)})")
    c, cd, cp = cpu.get(s, {}), cpu.get("discard", {}), cpu.get("plain-" + s, {})
    extra = [c[r] - cd[r] for r in c if r in cd]
    print(f"{s}: the BUs' CPU over discard's {med(extra):.3f} s per GB; the plain writer's "
          f"{med(list(cp.values())):.3f} s per GB (the writing's floor); "
          f"ratio {med([(c[r] - cd[r]) / cp[r] for r in c if r in cd and r in cp]):.2f}")
PY
