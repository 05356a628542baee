"""evb.Publisher and evb.Subscriber over real sockets on 127.0.0.1 (tcp and shm): exact tag
filtering, order under policy block, a gap under policy drop, subscribe/unsubscribe, and
errors that name what was wrong."""

import json
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

import evb
from conftest import EXAMPLES, evb_bin

TAGS = 10


def payload(tag, seq, size):
    """tag and seq (little-endian u64s), then byte i = (7 i + tag + seq) mod 256."""
    body = bytes((7 * i + tag + seq) % 256 for i in range(256)) * (size // 256 + 1)
    return (struct.pack("<QQ", tag, seq) + body[16:size])[:size]


def size_of(tag, seq):
    return 16 + (tag * 131 + seq * 17) % 3000


class Taker(threading.Thread):
    """Takes everything a subscriber receives until every publisher has closed."""

    def __init__(self, sub):
        super().__init__()
        self.sub = sub
        self.seqs = {}
        self.missed = {}
        self.bad = 0
        self.goodbyes = []
        self.closed = 0
        self.error = None

    def run(self):
        try:
            for m in self.sub:
                if isinstance(m, evb.Message):
                    self.bad += m.payload != payload(m.tag, m.seq, size_of(m.tag, m.seq))
                    self.seqs.setdefault((m.publisher, m.tag), []).append(m.seq)
                elif isinstance(m, evb.Gap):
                    self.missed[m.tag] = self.missed.get(m.tag, 0) + m.missed
                elif isinstance(m, evb.Goodbye):
                    self.goodbyes.append((m.publisher, m.code, m.reason))
                elif isinstance(m, evb.Closed):
                    self.closed += 1
        except Exception as e:  # reported by the test
            self.error = e


def meet(p, s):
    """Polls both sides (one thread) until the publisher has the subscription."""
    while p.subscribed < 1:
        with pytest.raises(evb.Timeout):
            s.recv(timeout=0.005)
        p.poll(0.005)


@pytest.mark.parametrize("transport,send_threads", [("tcp", 0), ("tcp", 1), ("shm", 0)])
def test_every_message_of_the_subscribed_tags_in_order_and_nothing_else(transport, send_threads):
    n = 500
    p = evb.Publisher("127.0.0.1:0", transport=transport, run_id="pytest", policy="block",
                      send_threads=send_threads)
    subs = [
        evb.Subscriber(p.address, "2,5-7", transport=transport, run_id="pytest"),
        evb.Subscriber([p.address], [0, (9, 9)], transport=transport, run_id="pytest",
                       delivery="latency"),
    ]
    takers = [Taker(s) for s in subs]
    for t in takers:
        t.start()
    assert p.wait_subscribers(2, timeout=30) == 2
    assert p.subscribers_of(6) == 1 and p.subscribers_of(3) == 0
    delivered = 0
    for seq in range(n):
        for tag in range(TAGS):
            data = payload(tag, seq, size_of(tag, seq))
            # any buffer: bytes, bytearray, a numpy array
            obj = (data, bytearray(data), np.frombuffer(data, dtype=np.uint8))[seq % 3]
            d, dropped = p.publish(tag, obj)
            assert dropped == 0
            delivered += d
    stats = p.close("pytest is done")
    assert stats["published"] == TAGS * n
    assert stats["delivered"] == delivered == 6 * n
    assert stats["dropped"] == 0
    for t, tags in zip(takers, [(2, 5, 6, 7), (0, 9)]):
        t.join(60)
        assert not t.is_alive() and t.error is None, t.error
        assert t.bad == 0
        assert sorted(tag for (_, tag) in t.seqs) == list(tags)
        for tag in tags:
            assert t.seqs[(0, tag)] == list(range(n)), f"tag {tag}"
        assert t.missed == {}
        assert t.goodbyes == [(0, 3, "pytest is done")]
        assert t.closed == 1
        assert t.sub.stats["received"] == len(tags) * n
        assert t.sub.recv(timeout=1) is None  # all closed: the end, at once


def test_drop_reports_a_gap_to_a_subscriber_that_did_not_read():
    n, size = 2000, 16384  # 64 MB for a subscriber that does not read
    p = evb.Publisher(policy="drop", max_queued=4096, run_id="pytest")
    s = evb.Subscriber(p.address, "1-2", run_id="pytest")
    meet(p, s)
    dropped = 0
    body = bytes(size - 16)
    for seq in range(n):
        for tag in (1, 2, 3):
            d, x = p.publish(tag, struct.pack("<QQ", tag, seq) + body)
            assert d + x == (0 if tag == 3 else 1)
            dropped += x
    assert dropped > 0
    # now it reads, the publisher polling meanwhile (the gaps of one that caught up)
    nxt = {1: 0, 2: 0}
    got = {1: 0, 2: 0}
    missed = {1: 0, 2: 0}
    accounted = 0
    while accounted < 2 * n:
        p.poll(0)
        try:
            m = s.recv(timeout=0.005)
        except evb.Timeout:
            continue
        if isinstance(m, evb.Message):
            assert m.seq == nxt[m.tag], (m.tag, m.seq, nxt[m.tag])
            assert m.payload[:16] == struct.pack("<QQ", m.tag, m.seq)
            assert len(m) == size
            nxt[m.tag] = m.seq + 1
            got[m.tag] += 1
            accounted += 1
        elif isinstance(m, evb.Gap):
            nxt[m.tag] += m.missed
            missed[m.tag] += m.missed
            accounted += m.missed
        else:
            pytest.fail(repr(m))
    assert accounted == 2 * n
    for tag in (1, 2):
        assert got[tag] + missed[tag] == n and nxt[tag] == n
    assert sum(missed.values()) == dropped > 0
    st = p.stats
    assert st["dropped"] == dropped
    assert st["delivered"] + st["dropped"] == 2 * n
    assert s.stats["missed"] == dropped
    assert s.stats["gaps"] >= 1
    p.close("bye")
    s.close()


def test_block_timeout_sends_nothing_and_names_the_tag():
    p = evb.Publisher(policy="block", max_queued=4096, block_timeout=0.05, run_id="pytest")
    s = evb.Subscriber(p.address, 3, run_id="pytest", delivery="latency")
    meet(p, s)
    big = bytes(65536)
    sent = 0
    with pytest.raises(evb.Timeout, match="tag 3"):
        while sent < 100000:
            p.publish(3, big)
            sent += 1
    assert p.stats["published"] == sent
    assert p.publish(4, big) == (0, 0)  # nobody's tag: not held back
    p.close()
    s.close()


def test_subscribe_and_unsubscribe_change_what_arrives():
    with evb.Publisher(run_id="pytest") as p:
        s = evb.Subscriber(p.address, [1], run_id="pytest", delivery="latency")
        meet(p, s)

        def round_(want):
            for tag in range(1, 5):
                p.publish(tag, struct.pack("<Q", tag))
            p.flush()
            tags = []
            while len(tags) < want:
                p.poll(0)
                try:
                    m = s.recv(timeout=0.005)
                except evb.Timeout:
                    continue
                assert m.payload == struct.pack("<Q", m.tag)
                tags.append(m.tag)
            return tags

        assert round_(1) == [1]
        s.subscribe("3-4")
        while p.subscribers_of(4) == 0:
            p.poll(0.005)
        assert round_(3) == [1, 3, 4]
        s.unsubscribe([(1, 1), 3])
        while p.subscribers_of(1):
            p.poll(0.005)
        assert round_(1) == [4]
        assert p.stats["delivered"] == 5
    # the with block closed the publisher: goodbye, then closed, then the end
    rest = list(s)
    assert [type(m) for m in rest] == [evb.Goodbye, evb.Closed], rest
    assert rest[0].reason == "closed"
    with pytest.raises(evb.StateError):
        p.publish(1, b"x")
    s.close()
    with pytest.raises(evb.StateError):
        s.recv(timeout=0)


def test_bad_input_names_what_was_wrong():
    with pytest.raises(evb.SetupError, match='policy "sometimes"'):
        evb.Publisher(policy="sometimes")
    with pytest.raises(evb.SetupError, match='transport "udp"'):
        evb.Publisher(transport="udp")
    with pytest.raises(evb.SetupError, match="max_queued 10 is outside"):
        evb.Publisher(max_queued=10)
    with pytest.raises(evb.SetupError, match="no-port-here"):
        evb.Publisher("no-port-here")
    with pytest.raises(ValueError, match="block_timeout"):
        evb.Publisher(block_timeout=-1)
    p = evb.Publisher(max_message=100)
    with pytest.raises(evb.SizeError, match="max_message 100"):
        p.publish(1, bytes(101))
    with pytest.raises(TypeError):
        p.publish(1, "not bytes")
    with pytest.raises(OverflowError):
        p.publish(-1, b"x")
    with pytest.raises(evb.SetupError, match='range "7-3" is empty'):
        evb.Subscriber(p.address, "7-3")
    with pytest.raises(evb.SetupError, match=r"range \(5, 1\) is empty"):
        evb.Subscriber(p.address, [(5, 1)])
    with pytest.raises(TypeError, match="1.5"):
        evb.Subscriber(p.address, [1.5])
    with pytest.raises(evb.SetupError, match='delivery "fast"'):
        evb.Subscriber(p.address, 1, delivery="fast")
    with pytest.raises(evb.SetupError, match="no publisher address"):
        evb.Subscriber([], 1)
    # nobody listens there: the connection's end says so, then the end
    s = evb.Subscriber("127.0.0.1:1", 1)
    m = s.recv(timeout=30)
    assert isinstance(m, evb.Closed) and m.publisher == 0 and m.reason
    assert s.recv(timeout=30) is None
    assert p.close() is not None and p.close() is None


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_python_subscriber_of_the_evb_pub_tool(transport, tmp_path):
    """The facade speaks to `evb pub` (the same handshake and messages): tags 1 and 3 of
    4, every message once, in order, each payload naming its tag and sequence."""
    summary = tmp_path / "pub.json"
    proc = subprocess.Popen(
        [evb_bin(), "pub", "--listen", "127.0.0.1:0", "--transport", transport, "--tags", "4",
         "--size", "64", "--count", "4000", "--wait", "1", "--json", str(summary)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line + proc.stderr.read()
        s = evb.Subscriber(line.split()[-1], "1,3", transport=transport)
        seqs = {1: [], 3: []}
        kinds = []
        for m in s:
            kinds.append(type(m).__name__)
            if isinstance(m, evb.Message):
                assert len(m.payload) == 64
                assert struct.unpack("<QQ", m.payload[:16]) == (m.tag, m.seq)
                seqs[m.tag].append(m.seq)
        assert seqs == {1: list(range(1000)), 3: list(range(1000))}
        assert kinds[-2:] == ["Goodbye", "Closed"]
        assert proc.wait(60) == 0, proc.stderr.read()
        pub = json.loads(summary.read_text())
        assert pub["published"] == 4000 and pub["delivered"] == 2000 and pub["dropped"] == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_the_example_as_two_processes(transport):
    """examples/pubsub.py: a publisher process and a subscriber process of tags 2,5-7."""
    ex = str(EXAMPLES / "pubsub.py")
    pub = subprocess.Popen([sys.executable, ex, "pub", "5000", transport],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = pub.stdout.readline()
        assert line.startswith("listening on "), line + pub.stderr.read()
        sub = subprocess.run([sys.executable, ex, "sub", line.split()[-1], "2,5-7", transport],
                             capture_output=True, text=True, timeout=120)
        assert sub.returncode == 0, sub.stderr
        got = json.loads(sub.stdout)
        assert got == {"received": {"2": 500, "5": 500, "6": 500, "7": 500}, "missed": 0,
                       "in_order": True, "goodbye": "the example publisher is done"}
        out, err = pub.communicate(timeout=60)
        assert pub.returncode == 0, err
        stats = json.loads(out)
        assert stats["published"] == 5000 and stats["delivered"] == 2000
        assert stats["dropped"] == 0
    finally:
        pub.kill()
        pub.wait()
