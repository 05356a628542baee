#!/usr/bin/env python3
"""A BU written from docs/protocol.md that says incarnation 0 in its control Hello (§3:
a BU's incarnation is 1…65535). The EVM must refuse it: the connection closes after the
handshake, and nothing of the run (Term, Start, Assign) comes. Prints one JSON line: whether
the HelloAck came, whether the EVM closed the connection within `--wait-s`, and the message
types it sent before that.
"""

import argparse
import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ru import HELLO, HELLO_ACK, MESSAGES, VERSION, Closed, Conn, messages  # noqa: E402

ROLE_BU, CONTROL = 2, 0


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--evm", required=True, help="the EVM's address")
    p.add_argument("--run-id", required=True)
    p.add_argument("--wait-s", type=float, default=5.0)
    a = p.parse_args()
    host, port = a.evm.rsplit(":", 1)
    deadline = time.monotonic() + 20
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    c = Conn(sock, a.evm)
    run, node = a.run_id.encode(), b"bu0"
    h = (struct.pack("<HBBHHQ", VERSION, CONTROL, ROLE_BU, 0, 0, 0)
         + bytes([len(run)]) + run + bytes([len(node)]) + node)
    c.send_frame(HELLO, h)
    kind, _, _ = c.read_frame(time.monotonic() + 5)
    acked = kind == HELLO_ACK
    kinds, closed = [], False
    until = time.monotonic() + a.wait_s
    sock.settimeout(0.05)
    try:
        while time.monotonic() < until:
            c.fill()
            for kind, count, body in c.frames():
                if kind == MESSAGES:
                    kinds.extend(t for t, _ in messages(count, body))
    except Closed:
        closed = True
    print(json.dumps({"acked": acked, "closed": closed, "kinds": kinds}), flush=True)


if __name__ == "__main__":
    main()
