"""Multi-process runs for the Python tests: the EVM and the other nodes as `evb node`
processes (the binary named by EVB_BIN, else target/{debug,release}/evb of this
repository), the Python producer or consumer in the test's process, all on 127.0.0.1."""

import json
import os
import pathlib
import random
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "crates" / "python" / "examples"


def evb_bin():
    if os.environ.get("EVB_BIN"):
        return os.environ["EVB_BIN"]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for profile in ("debug", "release"):
        if (target / profile / "evb").exists():
            return str(target / profile / "evb")
    pytest.fail("no evb binary: build it (cargo build -p evb) or set EVB_BIN")


_GIVEN = []


def free_base_port(n=8):
    """A base port with the next n - 1 free as well.

    Drawn at random below the kernel's ephemeral range (as evb_messaging::free_ports): a port
    in that range can be handed to another socket's outgoing connection between this check and
    the node's bind (seen in CI: a BU's port taken in that moment). No range overlaps one
    given before to this pytest process."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    lowest = 10000
    for _ in range(500):
        base = random.randrange(lowest, ephemeral_low - n)
        if any(base < e and base + n > b for b, e in _GIVEN):
            continue
        held = []
        try:
            for k in range(n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", base + k))
            _GIVEN.append((base, base + n))
            return base
        except OSError:
            pass
        finally:
            for t in held:
                t.close()
    pytest.fail(f"no free range of {n} loopback ports below {ephemeral_low}")


class Run:
    """A configuration (its ports found free) in a temporary directory, and `evb node`
    processes started from it."""

    def __init__(self, tmp, toml, procs):
        self.dir = pathlib.Path(tmp)
        self.config = self.dir / "run.toml"
        ports = f"[topology]\nbase_port = {free_base_port()}\n"
        toml = toml.replace("[topology]\n", ports) if "[topology]\n" in toml else toml + "\n" + ports
        self.config.write_text(toml)
        self.kids = {}
        for node in procs:
            self.kids[node] = subprocess.Popen(
                [evb_bin(), "node", "--json", "-", "--id", node, "--config",
                 str(self.config)],
                cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def python(self, script, *args):
        """Starts one of the examples as its own process."""
        return subprocess.Popen([sys.executable, str(EXAMPLES / script), *map(str, args)],
                                cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self, node, timeout=120):
        out, err = self.kids.pop(node).communicate(timeout=timeout)
        return out.decode(), err.decode()

    def evm_report(self):
        """Waits for every process (each must exit cleanly); the EVM's report."""
        report = None
        for node in list(self.kids):
            proc = self.kids[node]
            out, err = self.wait(node)
            assert proc.returncode == 0, f"{node} failed:\n{out}\n{err}"
            if node == "evm":
                report = json.loads(out)
        return report

    def close(self):
        for proc in self.kids.values():
            proc.kill()
            proc.wait()


@pytest.fixture
def run(tmp_path):
    runs = []

    def start(toml, procs):
        r = Run(tmp_path, toml, procs)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.close()


def assert_verdict_ok(report, events):
    assert report["ok"] is True, report
    r = report["run"]
    assert r["evm"]["triggered"] == events, r["evm"]
    assert r["evm"]["released"] == events
    assert report["verdict"] == [], report["verdict"]
    for bu in r["bus"]:
        assert bu["crc_errors"] == 0
        assert bu["duplicate_fragments"] == 0


def pattern(trigger, size):
    """The examples' payload: byte i of trigger t is (31 t + i) % 256."""
    start = (31 * trigger) % 256
    block = bytes((start + i) % 256 for i in range(256))
    return (block * (size // 256 + 1))[:size]
