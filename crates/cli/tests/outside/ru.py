#!/usr/bin/env python3
"""An evb readout unit (RU) written from docs/protocol.md alone, for the outside-RU tests.

It takes part in a run over TCP with or without the shared secret (EVB_SECRET): it calls
the EVM and every BU, says Ready, makes a fragment for every event it is assigned, holds
it until the EVM forwards its Release, sends the same bytes again when an event is
reassigned, and calls a lost BU again. It follows §6 item 11 on incarnations: an Assign's
fragments go only over a data connection whose HelloAck carried the Assign's incarnation;
those for an incarnation it was never connected to (a process that joined the run under
way, whose first Assign can come before its HelloAck) wait for that connection, at most
30 s, and are dropped (the bytes still held) when another incarnation of that BU answers.

`--lag-ms` makes it a slow reader: every message from the EVM is acted on that long after it
arrived, so that Assigns for a BU are still unread when that BU is killed, restarted and
called again. `--ignore-incarnation` breaks the rule on purpose (the test shows that it
then fails).

Fragments carry flags 0 and a payload anyone can check: for event k, the bytes
`(k * 131 + i * 7) mod 256` for i < `64 + k * 37 mod 200` (see `payload`).
"""

import argparse
import hashlib
import hmac
import json
import os
import selectors
import socket
import struct
import sys
import time

MAGIC = b"EVBF"
# the protocol version (frame header and Hello); `--protocol-version` speaks another, to see
# how a peer of an older version is refused
VERSION = 2
HELLO, HELLO_ACK, REJECT, MESSAGES, BYE, AUTH = 1, 2, 3, 4, 5, 6
CREDIT, ASSIGN, RELEASE, FRAGMENT = 0x0001, 0x0002, 0x0003, 0x0004
READY, START, STOP, HALT, REPORT, ABORT, HEARTBEAT = range(0x0010, 0x0017)
LINK_LOST = 0x0018
UNLIMITED = 2**64 - 1


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def payload(k):
    size = 64 + k * 37 % 200
    return bytes((k * 131 + i * 7) & 0xFF for i in range(size))


def fragment(k, source_id):
    p = payload(k)
    head = struct.pack("<QIHHIII", k, k & 0xFFFFFFFF, source_id, 0, len(p), crc32c(p), 0)
    head += struct.pack("<I", crc32c(head))
    return struct.pack("<HHI", FRAGMENT, 0, len(head) + len(p)) + head + p


def hello(channel, index, run_id, node_id, nonce):
    run, node = run_id.encode(), node_id.encode()
    return (struct.pack("<HBBHHQ", VERSION, channel, 1, index, 0, nonce)
            + bytes([len(run)]) + run + bytes([len(node)]) + node)


class Closed(Exception):
    pass


class Refused(Closed):
    """The peer sent a Reject: its reason."""


class Conn:
    """One connection: frames out numbered from 0, frames in checked in order."""

    def __init__(self, sock, name):
        self.sock, self.name = sock, name
        self.rx = bytearray()
        self.tx_seq = 0
        self.rx_seq = 0
        self.incarnation = 0

    def send_frame(self, kind, body, count=0):
        head = MAGIC + struct.pack("<HBBIIQ", VERSION, kind, 0, len(body), count, self.tx_seq)
        self.tx_seq += 1
        try:
            self.sock.sendall(head + body)
        except OSError as e:
            raise Closed(str(e))

    def send(self, msgs):
        """`msgs`: encoded messages (header and body each), sent as one Messages frame."""
        if msgs:
            self.send_frame(MESSAGES, b"".join(msgs), len(msgs))

    def fill(self):
        try:
            got = self.sock.recv(1 << 16)
        except (BlockingIOError, socket.timeout):
            return
        except OSError as e:
            raise Closed(str(e))
        if not got:
            raise Closed("closed by the peer")
        self.rx += got

    def frames(self):
        """Whole frames received so far: (type, count, payload)."""
        while len(self.rx) >= 24:
            magic, _, kind, flags, length, count, seq = struct.unpack_from("<4sHBBIIQ", self.rx)
            if magic != MAGIC or flags != 0 or seq != self.rx_seq:
                raise Closed(f"bad frame header (seq {seq}, expected {self.rx_seq})")
            if len(self.rx) < 24 + length:
                return
            body = bytes(self.rx[24:24 + length])
            del self.rx[:24 + length]
            self.rx_seq += 1
            yield kind, count, body

    def read_frame(self, deadline):
        while True:
            for f in self.frames():
                return f
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise Closed("handshake timed out")
            self.fill()


def messages(count, body):
    out, at = [], 0
    for _ in range(count):
        kind, _, length = struct.unpack_from("<HHI", body, at)
        out.append((kind, body[at + 8:at + 8 + length]))
        at += 8 + length
    if at != len(body):
        raise Closed("a Messages frame whose messages do not add up")
    return out


def msg(kind, body=b""):
    return struct.pack("<HHI", kind, 0, len(body)) + body


def connect(addr, channel, args, secret):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c = Conn(sock, addr)
    nonce = 0
    while secret and nonce == 0:
        nonce = int.from_bytes(os.urandom(8), "little")
    h = hello(channel, args.index, args.run_id, args.node_id, nonce)
    c.send_frame(HELLO, h)
    deadline = time.monotonic() + 5
    kind, _, ack = c.read_frame(deadline)
    if kind == REJECT:
        raise Refused(ack[2:].decode(errors="replace"))
    if kind != HELLO_ACK:
        raise Closed(f"refused (frame type {kind})")
    c.incarnation = struct.unpack_from("<H", ack, 6)[0]
    if secret:
        kind, _, proof = c.read_frame(deadline)
        signed = b"evb-acceptor" + struct.pack("<I", len(h)) + h + ack
        if kind != AUTH or not hmac.compare_digest(
                proof, hmac.new(secret, signed, hashlib.sha256).digest()):
            raise Closed("the acceptor's proof is wrong")
        mine = b"evb-connector" + struct.pack("<I", len(h)) + h + ack
        c.send_frame(AUTH, hmac.new(secret, mine, hashlib.sha256).digest())
    sock.settimeout(5)
    return c


class Ru:
    def __init__(self, args):
        self.args = args
        self.secret = os.environ.get("EVB_SECRET", "").encode()
        self.sel = selectors.DefaultSelector()
        self.evm = None
        self.bus = {}  # index -> Conn
        self.redial = {}  # index -> when to call again
        self.held = {}  # event id -> encoded fragment message
        self.inbox = []  # (when to act, kind, body) from the EVM
        self.running = False
        self.ready_sent = False
        self.made = self.resent = self.errors = self.released = 0
        self.held_no_conn = self.held_other_inc = 0
        self.reached = {}  # index -> incarnations this RU has been connected to
        self.awaiting = {}  # index -> [(incarnation, event id, until)], in order
        self.sent_on_reach = 0
        self.next_heartbeat = 0.0

    def log(self, what):
        print(f"outside {self.args.node_id}: {what}", file=sys.stderr, flush=True)

    def dial_bu(self, b, now):
        try:
            c = connect(self.args.bu[b], 1, self.args, self.secret)
        except (OSError, Closed) as e:
            self.redial[b] = now + 0.2
            return
        self.bus[b] = c
        self.redial.pop(b, None)
        self.sel.register(c.sock, selectors.EVENT_READ, ("bu", b))
        self.log(f"connected to bu[{b}], incarnation {c.incarnation}")
        self.reached.setdefault(b, set()).add(c.incarnation)
        # fragments kept for this process go now, in order; those for another process of
        # this BU never will (only one is in the run): the EVM reassigns them
        for inc, k, _ in self.awaiting.pop(b, []):
            if inc == c.incarnation and k in self.held:
                self.sent_on_reach += 1
                self.to_bu(b, inc, self.held[k])

    def lose_bu(self, b, why, now):
        c = self.bus.pop(b)
        self.sel.unregister(c.sock)
        c.sock.close()
        self.log(f"lost bu[{b}]: {why}")
        if self.running:
            # the incarnation of the BU process whose connection closed (§4, LinkLost)
            self.to_evm([msg(LINK_LOST, struct.pack("<HH4x", b, c.incarnation))])
        self.redial[b] = now + 0.2

    def to_evm(self, msgs):
        try:
            self.evm.send(msgs)
        except Closed as e:
            self.log(f"lost the EVM: {e}")
            sys.exit(1)

    def to_bu(self, b, inc, frag, k=None):
        """Sends a held fragment to BU `b` if it is connected as incarnation `inc`; keeps
        event `k`'s for an incarnation never connected to, until it is."""
        c = self.bus.get(b)
        never = inc != 0 and inc not in self.reached.get(b, set())
        if never and k is not None and not self.args.ignore_incarnation:
            self.awaiting.setdefault(b, []).append((inc, k, time.monotonic() + 30))
            return
        if c is None:
            self.held_no_conn += 1
            return
        if c.incarnation != inc and not self.args.ignore_incarnation:
            self.held_other_inc += 1
            return
        try:
            c.send([frag])
        except Closed as e:
            self.lose_bu(b, str(e), time.monotonic())

    def act(self, kind, body):
        if kind == START:
            self.running = True
        elif kind == ASSIGN:
            first, count, bu, inc = struct.unpack("<QIHH", body)
            for k in range(first, first + count):
                again = k in self.held
                if not again:
                    self.held[k] = fragment(k, self.args.source_id)
                    self.made += 1
                else:
                    self.resent += 1
                self.to_bu(bu, inc, self.held[k], k)
        elif kind == RELEASE:
            first, count, _, _ = struct.unpack("<QIHH", body)
            for k in range(first, first + count):
                if self.held.pop(k, None) is None:
                    self.errors += 1
                else:
                    self.released += 1
        elif kind == STOP:
            report = {"fragments_sent": self.made, "retained": len(self.held),
                      "errors": self.errors, "fragments_resent": self.resent}
            self.to_evm([msg(REPORT, json.dumps(report).encode())])
        elif kind == HALT:
            for c in [self.evm, *self.bus.values()]:
                try:
                    c.send_frame(BYE, b"")
                except Closed:
                    pass
            self.log(f"halted: made {self.made}, sent again {self.resent}, held back from "
                     f"another incarnation {self.held_other_inc}, held back with no "
                     f"connection {self.held_no_conn}, sent once reached "
                     f"{self.sent_on_reach}, released {self.released}, "
                     f"errors {self.errors}")
            sys.exit(0 if not self.held and self.errors == 0 else 1)
        elif kind == ABORT:
            self.log(f"aborted: {body.decode(errors='replace')}")
            sys.exit(1)

    def run(self):
        a = self.args
        deadline = time.monotonic() + 10
        while self.evm is None:
            try:
                self.evm = connect(a.evm, 0, a, self.secret)
            except Refused as e:
                self.log(f"refused by the EVM: {e}")
                sys.exit(3)
            except (OSError, Closed):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sel.register(self.evm.sock, selectors.EVENT_READ, ("evm", 0))
        for b in range(len(a.bu)):
            while b not in self.bus:
                self.dial_bu(b, time.monotonic())
                if b not in self.bus:
                    if time.monotonic() > deadline:
                        raise Closed(f"bu[{b}] does not answer")
                    time.sleep(0.05)
        while True:
            now = time.monotonic()
            if not self.ready_sent and len(self.bus) == len(a.bu):
                self.to_evm([msg(READY, struct.pack("<Q", UNLIMITED))])
                self.ready_sent = True
            if now >= self.next_heartbeat:
                self.next_heartbeat = now + a.heartbeat_ms / 1000
                self.to_evm([msg(HEARTBEAT)])
                for b in list(self.bus):
                    try:
                        self.bus[b].send([msg(HEARTBEAT)])
                    except Closed as e:
                        self.lose_bu(b, str(e), now)
            for b, at in list(self.redial.items()):
                if now >= at:
                    self.dial_bu(b, now)
            for b, waiting in self.awaiting.items():
                # kept at most 30 s (the bytes stay held for a reassignment)
                waiting[:] = [w for w in waiting if w[2] > now]
            while self.inbox and self.inbox[0][0] <= now:
                _, kind, body = self.inbox.pop(0)
                self.act(kind, body)
            for key, _ in self.sel.select(timeout=0.005):
                role, b = key.data
                c = self.evm if role == "evm" else self.bus.get(b)
                if c is None:
                    continue
                try:
                    c.fill()
                    frames = list(c.frames())
                except Closed as e:
                    if role == "evm":
                        # what it sent before it closed still counts (a Halt, then Bye)
                        for _, kind, body in self.inbox:
                            self.act(kind, body)
                        self.log(f"lost the EVM: {e}")
                        sys.exit(1)
                    self.lose_bu(b, str(e), now)
                    continue
                for kind, count, body in frames:
                    if kind == BYE:
                        continue
                    if kind != MESSAGES:
                        continue
                    if role == "evm":
                        for m in messages(count, body):
                            self.inbox.append((now + a.lag_ms / 1000, *m))


def main():
    global VERSION
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--evm", required=True, help="the EVM's host:port")
    p.add_argument("--bu", action="append", default=[], help="each BU's host:port, in order")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--source-id", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--heartbeat-ms", type=int, default=100)
    p.add_argument("--lag-ms", type=int, default=0)
    p.add_argument("--ignore-incarnation", action="store_true")
    p.add_argument("--protocol-version", type=int, default=VERSION)
    args = p.parse_args()
    VERSION = args.protocol_version
    Ru(args).run()


if __name__ == "__main__":
    main()
