#!/usr/bin/env bash
# Screenshots of the run page (docs/control.md, "GET /"), into docs/img/: `evb up` of a
# system, a run started and watched for a while, then headless Chromium's picture of the
# page, for 2 RUs × 2 BUs and then 16 × 16 (SIZES="2x2" for the small one only).
#
#   scripts/screenshots.sh            # builds evb (debug) unless EVB names a binary
#   EVB=target/release/evb SIZES="2x2 16x16" WATCH_S=20 scripts/screenshots.sh
#
# Needs chromium and curl. The system runs on this host only (loopback, no secret).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"2x2 16x16"}
WATCH_S=${WATCH_S:-15}
OUT=${OUT:-docs/img}
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$CHROMIUM" ] || { echo "screenshots: chromium is not installed" >&2; exit 1; }
if [ -z "${EVB:-}" ]; then
    cargo build -q -p evb --bin evb
    EVB=${CARGO_TARGET_DIR:-target}/debug/evb
fi
mkdir -p "$OUT"
work=$(mktemp -d)
up_pid=
cleanup() {
    if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
        kill "$up_pid" 2>/dev/null || true
        wait "$up_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

post() { # URL COMMAND
    curl -fsS -X POST -H 'Content-Type: application/json' -d '{}' "$1api/v1/$2" >/dev/null
}

shot() { # RUS BUS RATE_HZ WIDTH HEIGHT NAME
    local rus=$1 bus=$2 rate=$3 width=$4 height=$5 name=$6
    cat >"$work/run.toml" <<EOF
[run]
events = 0
duration_s = 600
rate_hz = $rate
[fragments]
size = 4096
[topology]
rus = $rus
bus = $bus
EOF
    "$EVB" up --config "$work/run.toml" >"$work/up.log" 2>&1 &
    up_pid=$!
    local url=
    for _ in $(seq 1 300); do
        url=$(sed -n 's/^evb up: run page and control API: //p' "$work/up.log" | head -n1)
        [ -n "$url" ] && break
        kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.log" >&2; exit 1; }
        sleep 0.2
    done
    [ -n "$url" ] || { echo "screenshots: evb up printed no URL" >&2; cat "$work/up.log" >&2; exit 1; }
    echo "screenshots: ${rus}x${bus} at $url, watching the run for ${WATCH_S} s"
    post "$url" start
    sleep "$WATCH_S"
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$work/profile" --virtual-time-budget=4000 \
        --window-size="$width,$height" --screenshot="$OUT/$name" "$url" 2>/dev/null
    echo "screenshots: $OUT/$name"
    post "$url" stop
    for _ in $(seq 1 150); do
        curl -fsS "${url}api/v1/status" | grep -qF '"legal":["configure","start","halt"]' && break
        sleep 0.2
    done
    post "$url" halt
    wait "$up_pid" || true
    up_pid=
}

for size in $SIZES; do
    rus=${size%x*}
    bus=${size#*x}
    case $size in
        2x2) shot "$rus" "$bus" 20000 1280 1000 run-page-2x2.png ;;
        *) shot "$rus" "$bus" 2000 1400 2100 "run-page-$size.png" ;;
    esac
done
