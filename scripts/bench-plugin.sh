#!/bin/sh
# Fragments/s into one RU through the built-in generator, the Rust producer
# (crates/plugin/examples/producer.rs), the C producer (crates/capi/examples/producer.c) and
# the Python producer (crates/python/examples/producer.py: zero copy through numpy, and
# --copy through submit_copy; built with maturin into target/pyenv), one after the other in one invocation, same topology: 1 RU, 2 BUs (discard), EVM, over tcp
# on 127.0.0.1. The rate is the EVM's: events released / seconds from Start to the last.
#
#   scripts/bench-plugin.sh [EVENTS] [FRAGMENT_BYTES]     # default 200000 events of 4096 B
set -eu
events=${1:-200000}
size=${2:-4096}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}/release
cargo build --release --manifest-path "$root/Cargo.toml" -p evb -p evb-capi
cargo build --release --manifest-path "$root/Cargo.toml" -p evb-plugin --examples
pyenv=$root/target/pyenv
[ -x "$pyenv/bin/python" ] || python3 -m venv "$pyenv"
"$pyenv/bin/python" -m pip install -q --disable-pip-version-check maturin numpy
(cd "$root/crates/python" && VIRTUAL_ENV="$pyenv" PATH="$pyenv/bin:$PATH" maturin develop -q --release)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 "$root/crates/capi/examples/producer.c" -I "$root/crates/capi/include" \
    -L "$target" -Wl,-rpath,"$target" -levb -o "$work/cproducer"
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$pyenv/bin/python" "$root/crates/python/examples/producer.py" > "$work/pyproducer"
printf '#!/bin/sh\nexec "%s" "%s" "$@" --copy\n' "$pyenv/bin/python" "$root/crates/python/examples/producer.py" > "$work/pycopy"
chmod +x "$work/pyproducer" "$work/pycopy"
free_ports() { # a base port with the next 7 free too, below the ephemeral range
    python3 -c 'import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    base = random.randrange(10000, low - 8)
    held = []
    try:
        for k in range(8):
            t = socket.socket(); held.append(t); t.bind(("127.0.0.1", base + k))
        print(base); break
    except OSError:
        pass
    finally:
        for t in held: t.close()'
}

config() { # $1: source kind
    cat <<EOF
[run]
id = "bench"
events = $([ "$1" = generator ] && echo "$events" || echo 0)
duration_s = 0
[source]
kind = "$1"
max_fragment = $size
[fragments]
size = $size
[topology]
rus = 1
bus = 2
base_port = $port
EOF
}

rate() { # the EVM's report on stdin: fragments/s and MB/s
    python3 -c 'import json,sys
r=json.load(sys.stdin)["run"]; s=r["seconds"]; n=r["evm"]["released"]
b=sum(x["payload_bytes_built"] for x in r["bus"])
print(f"{n} fragments in {s:.2f} s: {n/s:,.0f} fragments/s, {b/s/1e6:,.0f} MB/s")'
}

run() { # $1: label, $2: source kind, $3: the producer program (none for the generator)
    label=$1 kind=$2 prog=${3:-}
    port=$(free_ports)
    config "$kind" > "$work/run.toml"
    "$target/evb" node --config "$work/run.toml" --id evm --json "$work/evm.json" > /dev/null 2> "$work/evm.log" &
    for n in bu0 bu1; do "$target/evb" node --config "$work/run.toml" --id $n > /dev/null 2>&1 & done
    if [ -z "$prog" ]; then
        "$target/evb" node --config "$work/run.toml" --id ru0 > /dev/null 2>&1
    else
        "$prog" "$work/run.toml" ru0 "$events" "$size" > "$work/producer.log" 2>&1 ||
            { cat "$work/producer.log"; exit 1; }
    fi
    wait
    printf '%-10s ' "$label"
    rate < "$work/evm.json"
}

echo "$events events, fragments of $size bytes, 1 RU, 2 BUs (discard), tcp on 127.0.0.1"
run generator generator
run rust api "$target/examples/producer"
run c api "$work/cproducer"
run python api "$work/pyproducer"
run py-copy api "$work/pycopy"
