#!/usr/bin/env bash
# Runs every test of the workspace: formatting, lints, unit and multi-process tests.
# Installs what it needs on a fresh Debian machine (root: apt-get; otherwise it says what is missing).
#
#   ./scripts/test.sh            # the suite (CI runs this)
#   ./scripts/test.sh --loaded   # the same beside two busy loops, as on a busy CI runner:
#                                # every test must hold on a loaded host too
set -euo pipefail
cd "$(dirname "$0")/.."

busy=()
if [ "${1:-}" = "--loaded" ]; then
    # two processes that spin for as long as the suite runs (on this project's 2-core hosts,
    # the load of a second job beside the CI run), ended however the script ends
    for _ in 1 2; do
        sh -c 'while :; do :; done' &
        busy+=($!)
    done
    trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT
    echo "test.sh: two busy loops run beside the suite (pids ${busy[*]})"
elif [ -n "${1:-}" ]; then
    echo "test.sh: unknown option $1 (only --loaded)" >&2
    exit 2
fi

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
# The observability tests drive the run page in headless Chromium through chromedriver.
can_apt=false
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then can_apt=true; fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if $can_apt; then
        need_apt+=(chromium chromium-driver)
    else
        echo "test.sh: chromium and chromedriver are not installed: the run page test will be skipped" >&2
    fi
fi
# The hdf5 sink: Debian's libhdf5 headers to build it (evb's `hdf5` feature). Optional: without
# them evb builds without it, and `sink.kind = "hdf5"` is refused by name.
if ! pkg-config --exists hdf5 2>/dev/null; then
    if $can_apt; then
        need_apt+=(libhdf5-dev)
    else
        echo "test.sh: libhdf5-dev is not installed: evb is built and tested without the hdf5 sink" >&2
    fi
fi
# maturin sets the Python module's library path with patchelf (without it, only a warning)
if $can_apt && ! command -v patchelf >/dev/null 2>&1; then need_apt+=(patchelf); fi
# The launcher tests start runs with the real engines: a private Slurm cluster on localhost
# (scripts/slurm-local.sh) and Open MPI's mpirun.
if ! command -v srun >/dev/null 2>&1 || ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    if $can_apt; then
        need_apt+=(slurm-wlm munge)
    else
        echo "test.sh: slurm-wlm and munge are not installed: the Slurm launcher tests will be skipped" >&2
    fi
fi
if ! command -v mpirun >/dev/null 2>&1; then
    if $can_apt; then
        need_apt+=(openmpi-bin)
    else
        echo "test.sh: openmpi-bin is not installed: the mpirun launcher test will be skipped" >&2
    fi
fi
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: installing ${need_apt[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "test.sh: please install: ${need_apt[*]}" >&2
        exit 1
    fi
fi
# Prometheus (the server and promtool) for the metrics tests: unpacked from Debian's package
# into target/tools rather than installed (the package pulls in a web of dependencies).
if ! command -v promtool >/dev/null 2>&1 && [ ! -x target/tools/prometheus/usr/bin/promtool ]; then
    if $can_apt; then
        echo "test.sh: unpacking Debian's prometheus into target/tools"
        mkdir -p target/tools
        (cd target/tools && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; } \
            && dpkg-deb -x prometheus_*.deb prometheus && rm -f prometheus_*.deb)
    else
        echo "test.sh: promtool and prometheus are not installed: the metrics tests will be skipped" >&2
    fi
fi
# Where the script could install the tools, a missing one is a test failure, not a skip.
if $can_apt; then export EVB_REQUIRE_TOOLS=1; fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

# Python: a virtual environment in target/pyenv with maturin, pytest, numpy and h5py from
# PyPI, for the Python bindings (crates/python, the module `evb`: built into it below, and
# its tests run against the evb binary, multi-process runs on 127.0.0.1) and for the tests
# that read the HDF5 sink's files with h5py.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    if $can_apt; then
        echo "test.sh: installing python3 python3-venv python3-pip"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip >/dev/null
    else
        echo "test.sh: please install python3 with venv and pip (Debian: python3-venv python3-pip)" >&2
        exit 1
    fi
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "test.sh: the Python bindings need Python 3.11 or later; python3 is $(python3 -V 2>&1)" >&2
    exit 1
fi
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
pyenv=target/pyenv
[ -x "$pyenv/bin/python" ] || python3 -m venv "$pyenv"
"$pyenv/bin/python" -m pip install -q --disable-pip-version-check maturin pytest numpy h5py
# the HDF5 tests read the sink's files with h5py from this environment
export EVB_PYTHON="$PWD/$pyenv/bin/python"

# evb with the hdf5 sink where libhdf5's headers are here
features=()
if pkg-config --exists hdf5 2>/dev/null; then features=(--features evb/hdf5); fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets "${features[@]}" -- -D warnings
# the run records of the tests' runs (run.records_dir's default) go to a folder of this
# suite's own, not to the user's ~/.local/state/evb
XDG_STATE_HOME="$(mktemp -d "${TMPDIR:-/tmp}/evb-test-state.XXXXXX")"
export XDG_STATE_HOME
trap 'rm -rf "$XDG_STATE_HOME"; kill "${busy[@]}" 2>/dev/null || true' EXIT
# a test that cannot run here says why in this file (evb_buffers::skips), counted at the end;
# and what each test binary and pytest said, for the overall count
export EVB_SKIP_LOG="$XDG_STATE_HOME/skipped.txt"
: >"$EVB_SKIP_LOG"
results="$XDG_STATE_HOME/results.txt"
# every test binary runs even when one fails (the script still fails at the end)
cargo test --workspace --no-fail-fast "${features[@]}" 2>&1 | tee "$results"

# the module, built into the environment, and its tests
cargo build -p evb "${features[@]}"
(cd crates/python && VIRTUAL_ENV="$PWD/../../$pyenv" PATH="$PWD/../../$pyenv/bin:$PATH" maturin develop -q)
EVB_BIN="$target_dir/debug/evb" "$pyenv/bin/python" -m pytest -q -rs crates/python/tests | tee -a "$results"

# The wheel as a user installs it: `maturin build` (debug, as above: quicker, the same
# files), pip into a fresh virtual environment (target/pywheel-venv, made anew each run)
# with numpy and mypy, its stubs checked against the module (stubtest), the examples
# type-checked (`mypy --strict`) against those stubs, and the tests that run the examples as
# processes (and the fail-fast ones) run again against the installed package instead of the
# development build.
wheels="$target_dir/pywheels"
rm -rf "$wheels"
(cd crates/python && VIRTUAL_ENV="$PWD/../../$pyenv" PATH="$PWD/../../$pyenv/bin:$PATH" maturin build -q --out "$wheels")
wheelenv=target/pywheel-venv
rm -rf "$wheelenv"
python3 -m venv "$wheelenv"
"$wheelenv/bin/python" -m pip install -q --disable-pip-version-check "$wheels"/evb-*.whl numpy mypy pytest
"$wheelenv/bin/python" - <<'PY'
import importlib.resources, sys
import evb
assert sys.prefix in evb.__file__, f"evb from {evb.__file__}, not the wheel's install"
files = {f.name for f in importlib.resources.files("evb").iterdir()}
assert {"py.typed", "__init__.pyi"} <= files, f"the wheel's package evb lacks its stubs: {files}"
assert evb.__doc__ and "docs/plugin.md" in evb.__doc__, evb.__doc__
PY
# the stubs against the module as built: every name, signature and default
"$wheelenv/bin/python" -m mypy.stubtest evb --concise --ignore-unused-allowlist \
    --allowlist crates/python/stubtest-allowlist.txt
# as Python 3.12, where buffers are typed (PEP 688): before it numpy's stubs take only their
# own list of buffer types in numpy.frombuffer, not evb.Buffer
(cd crates/python/examples && "../../../$wheelenv/bin/python" -m mypy --strict --cache-dir=/dev/null --python-version 3.12 .)
EVB_BIN="$target_dir/debug/evb" "$wheelenv/bin/python" -m pytest -q -rs -p no:cacheprovider crates/python/tests \
    -k "example or every_byte or without_an_evm" | tee -a "$results"

# One count for the whole suite, and every skip with its reason: a test that did not run is
# said, not hidden among those that passed.
# (a grep that finds nothing is a count of 0, not the script's end under pipefail)
count() { { grep -E "$2" "$results" || true; } | { grep -Eo "$3" || true; } | awk "{n += \$$1} END {print n + 0}"; }
rust=$(count 4 'test result: ok\.' 'test result: ok\. [0-9]+ passed')
# pytest's last line ("34 passed in 20.29s", "6 passed, 28 deselected in 6.02s"), not
# cargo's "test result: ... finished in 0.04s"
python=$(count 1 '^[0-9]+ passed.* in [0-9.]+s' '^[0-9]+ passed')
py_skipped=$(count 1 '^[0-9]+ passed.* in [0-9.]+s' '[0-9]+ skipped')
skipped=$(($(wc -l <"$EVB_SKIP_LOG") + py_skipped))
echo "test.sh: $rust Rust tests and $python Python tests passed, 0 failed; $skipped skipped"
if [ "$skipped" -gt 0 ]; then
    sort "$EVB_SKIP_LOG" | uniq -c | sed 's/^/test.sh:   skipped /'
    grep -E '^SKIPPED' "$results" | sed 's/^/test.sh:   /' || true
fi
