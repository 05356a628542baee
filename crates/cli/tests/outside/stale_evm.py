#!/usr/bin/env python3
"""Two EVMs written from docs/protocol.md that hand a node a stale epoch (§6 item 15).

The first listens at the node's EVM address and opens the node's control connection with
Term(1), as a standby that took a run over would, and Start; after `--hold-s` it closes
without Bye, as a lost EVM does. The second listens at the node's standby address and opens with
Term(0): an EVM replaced since. The node must refuse it: Fence(1) (the epoch it followed),
then Bye. With `--second-epoch -1` the second sends no Term at all and opens with Start: the
node must refuse it too (protocol.md §6 item 16: the Term is required), with Bye. Prints one JSON line: the message types each EVM received, the Fence epochs, and
whether the node closed the second connection with Bye.
"""

import argparse
import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ru import BYE, HELLO, HELLO_ACK, MESSAGES, VERSION, Closed, Conn, messages, msg  # noqa: E402

START, FENCE, TERM = 0x0011, 0x0022, 0x0023


def ack(run_id):
    """An EVM's HelloAck payload: control channel, role EVM, index 0, no secret."""
    run, node = run_id.encode(), b"evm"
    return (struct.pack("<HBBHHQ", VERSION, 0, 0, 0, 0, 0)
            + bytes([len(run)]) + run + bytes([len(node)]) + node)


def listen(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(4)
    return s


def serve(listener, run_id, epoch, hold_s, start):
    """Takes one node's call, speaks at `epoch` (then says Start, with `start`: the node is
    in a run, and calls its standby when this EVM is lost), and reads what the node sends
    for `hold_s` (or until it closes). Returns (message types, Fence epochs, closed with
    Bye)."""
    listener.settimeout(20)
    sock, _ = listener.accept()
    c = Conn(sock, "node")
    kind, _, _ = c.read_frame(time.monotonic() + 5)
    if kind != HELLO:
        raise Closed(f"expected a Hello, got frame type {kind}")
    c.send_frame(HELLO_ACK, ack(run_id))
    if epoch < 0:
        # no Term: the EVM's first word is Start
        c.send([msg(START)])
    else:
        c.send([msg(TERM, struct.pack("<H", epoch) + bytes(6))]
               + ([msg(START)] if start else []))
    kinds, fences, bye = [], [], False
    until = time.monotonic() + hold_s
    sock.settimeout(0.05)
    try:
        while time.monotonic() < until and not bye:
            c.fill()
            for kind, count, body in c.frames():
                if kind == BYE:
                    bye = True
                elif kind == MESSAGES:
                    for t, b in messages(count, body):
                        kinds.append(t)
                        if t == FENCE:
                            fences.append(struct.unpack_from("<H", b)[0])
    except Closed:
        pass
    sock.close()
    return kinds, fences, bye


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run-id", required=True)
    p.add_argument("--first", required=True, help="the node's EVM address")
    p.add_argument("--second", required=True, help="the node's standby address")
    p.add_argument("--hold-s", type=float, default=0.5)
    p.add_argument("--second-epoch", type=int, default=0)
    p.add_argument("--second-hold-s", type=float, default=10.0)
    a = p.parse_args()
    first, second = listen(a.first), listen(a.second)
    print("listening", flush=True)
    k1, f1, _ = serve(first, a.run_id, 1, a.hold_s, True)
    k2, f2, bye = serve(second, a.run_id, a.second_epoch, a.second_hold_s, False)
    print(json.dumps({"first": k1, "second": k2, "fences_first": f1, "fences": f2,
                      "bye": bye}), flush=True)


if __name__ == "__main__":
    main()
