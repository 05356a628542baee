#!/usr/bin/env bash
# Runs every test of the workspace: formatting, lints, unit and multi-process tests.
# Installs what it needs on a fresh Debian machine (root: apt-get; otherwise it says what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# The ofi transport: libfabric's headers to build its shim, the library to run it (tcp
# provider). Optional: without them evb builds and the ofi tests say they were skipped.
if [ ! -f /usr/include/rdma/fabric.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        need_apt+=(libfabric-dev)
    else
        echo "test.sh: libfabric-dev is not installed: the ofi transport will not be built or tested" >&2
    fi
fi
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: installing ${need_apt[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "test.sh: please install: ${need_apt[*]}" >&2
        exit 1
    fi
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
