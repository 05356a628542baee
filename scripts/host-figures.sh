#!/usr/bin/env bash
# The storage and building-by-time figures on another host, each beside its same-minute
# references (issues 67 and 68): `evb bench sinks` with every core, the same pinned to two
# cores (this project's development hosts have two: the control that says whether the cores
# or the code are the limit), and `evb bench build`'s quick rows (time slices and readout
# windows beside nxn). It names the host first (CPU model, cores, memory, /dev/shm, the
# hypervisor's steal over the whole script), and writes every step's output under OUT.
#
#   scripts/host-figures.sh EVB_BINARY OUT [STEP_TIMEOUT_S]
#
# QUICK=1 runs every step's quick mode (a check of the script, not figures).
# Each step has its own time limit (default 200 s) so that a slow one does not cost the
# others. Needs nothing but the evb binary (built without the hdf5 feature, HDF5's row is
# left out) and coreutils' taskset.
set -uo pipefail
evb=$(realpath "${1:?evb binary}"); out=${2:?output folder}; limit=${3:-200}
mkdir -p "$out"
steal() { awk '/^cpu /{print $9}' /proc/stat; }
ticks=$(getconf CLK_TCK)
s0=$(steal); t0=$(date +%s)
{
  echo "host: $(hostname) at $(date -u +%FT%TZ)"
  echo "cpu: $(awk -F: '/model name/{print $2; exit}' /proc/cpuinfo | sed 's/^ *//')"
  echo "cores: $(nproc) (online $(getconf _NPROCESSORS_ONLN))"
  echo "memory: $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel: $(uname -r)"
  echo "/dev/shm: $(df -h /dev/shm | awk 'NR==2{print $2" size, "$4" free"}')"
} | tee "$out/host.txt"

step() {
  local name=$1; shift
  echo "== $name: $*" | tee -a "$out/steps.txt"
  local a=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc after $(( $(date +%s) - a )) s" | tee -a "$out/steps.txt"
  tail -n 25 "$out/$name.log"
}

if [ "${QUICK:-0}" = 1 ]; then
  sinks=(--quick); build=(--quick --reps 1 --build-seconds 1 --no-iperf3)
else
  sinks=(); build=(--quick --reps 3 --build-seconds 3 --no-iperf3)
fi
step sinks-all-cores "$evb" bench sinks "${sinks[@]}" --out "$out/sinks-all"
step sinks-two-cores taskset -c 0,1 "$evb" bench sinks "${sinks[@]}" --out "$out/sinks-2c"
step build-quick "$evb" bench build "${build[@]}" --out "$out/build"

s1=$(steal); t1=$(date +%s)
awk -v s="$((s1 - s0))" -v t="$((t1 - t0))" -v hz="$ticks" -v n="$(nproc)" \
  'BEGIN{printf "steal: %.3f of a core on average over %d s (%.2f %% of the host)\n", s/hz/t, t, 100*s/hz/t/n}' \
  | tee -a "$out/host.txt"
