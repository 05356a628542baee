#!/usr/bin/env bash
# A private one-node Slurm cluster on localhost, for tests and trials (root, Debian's
# slurm-wlm and munge; no cgroups, no accounting).
#
#   scripts/slurm-local.sh start DIR   # prints the exports a caller needs (eval it)
#   scripts/slurm-local.sh stop DIR    # stops that cluster's daemons and jobs, nothing else
#
# Everything lives in DIR: slurm.conf, the controller's state, slurmd's spool, the logs, and
# a munged with its own key and socket. The node declares 8 CPUs whatever the host has
# (SlurmdParameters=config_overrides) so `srun -n 5` runs on a 2-core machine. The two
# Slurm ports are free ones (or SLURM_LOCAL_PORTS="CTLD SLURMD"), so clusters in
# different folders run side by side. Every daemon carries EVB_SLURM_LOCAL=DIR in its
# environment (and so do the slurmstepd it starts): `stop` finds them by it.
set -euo pipefail

usage() {
    echo "usage: $0 start DIR | stop DIR" >&2
    exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)

# The pids of the processes started for $dir (daemons and job steps), from their environment.
pids_of_dir() {
    local p
    for p in /proc/[0-9]*; do
        if tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "EVB_SLURM_LOCAL=$dir"; then
            echo "${p#/proc/}"
        fi
    done
}

# Local TCP ports in use (listening or connected), from /proc/net/tcp{,6}.
used_ports() {
    local f _sl local_addr _rest
    for f in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$f" ] || continue
        while read -r _sl local_addr _rest; do
            [[ $local_addr == *:* ]] && echo $((16#${local_addr##*:}))
        done < <(tail -n +2 "$f")
    done | sort -un
}

free_port() {
    local used p
    used=$(used_ports)
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        if ! grep -qx "$p" <<<"$used" && [ "$p" != "${1:-}" ]; then
            echo "$p"
            return
        fi
    done
    echo "slurm-local: no free port found" >&2
    exit 1
}

stop() {
    if [ -f "$dir/slurm.conf" ] && command -v squeue >/dev/null; then
        # the cluster's jobs first, so that their tasks end with them
        local jobs
        jobs=$(SLURM_CONF="$dir/slurm.conf" timeout 5 squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            SLURM_CONF="$dir/slurm.conf" timeout 5 scancel $jobs 2>/dev/null || true
        fi
    fi
    local pids
    pids=$(pids_of_dir)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 50); do
        pids=$(pids_of_dir)
        [ -z "$pids" ] && return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
}

start() {
    for tool in slurmctld slurmd sinfo munged; do
        if ! command -v "$tool" >/dev/null; then
            echo "slurm-local: $tool is not installed (Debian: apt-get install slurm-wlm munge)" >&2
            exit 1
        fi
    done
    stop # a cluster left in this folder by an earlier run
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/munge"
    chmod 700 "$dir/munge"
    local ctld_port slurmd_port
    if [ -n "${SLURM_LOCAL_PORTS:-}" ]; then
        read -r ctld_port slurmd_port <<<"$SLURM_LOCAL_PORTS"
    else
        ctld_port=$(free_port)
        slurmd_port=$(free_port "$ctld_port")
    fi

    # munge: a key of its own, a socket in $dir
    local sock="$dir/munge/munge.socket"
    if [ ! -s "$dir/munge/munge.key" ]; then
        (umask 077 && head -c 1024 /dev/urandom >"$dir/munge/munge.key")
    fi
    EVB_SLURM_LOCAL="$dir" munged --force --key-file="$dir/munge/munge.key" --socket="$sock" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed" >"$dir/log/munged.out" 2>&1

    cat >"$dir/slurm.conf" <<EOF
# a one-node cluster for evb's tests (scripts/slurm-local.sh)
ClusterName=evblocal
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$dir/slurm.conf"
    EVB_SLURM_LOCAL="$dir" slurmctld -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1
    EVB_SLURM_LOCAL="$dir" slurmd -N localhost -f "$SLURM_CONF" >"$dir/log/slurmd.out" 2>&1

    # ready when the node is idle
    local state=""
    for _ in $(seq 150); do
        state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
        [ "$state" = idle ] && break
        sleep 0.1
    done
    if [ "$state" != idle ]; then
        echo "slurm-local: the node is not idle after 15 s (state: '${state:-none}'); logs in $dir/log:" >&2
        tail -n 5 "$dir"/log/*.log >&2 || true
        stop
        exit 1
    fi
    echo "export SLURM_CONF=$dir/slurm.conf"
}

case $cmd in
start) start ;;
stop) stop ;;
*) usage ;;
esac
