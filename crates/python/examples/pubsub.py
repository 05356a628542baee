"""Publish/subscribe by tag in Python, publisher and subscriber as two processes.

    python pubsub.py pub COUNT [TRANSPORT]          # prints "listening on ADDR" first
    python pubsub.py sub ADDR TAGS [TRANSPORT]      # e.g. TAGS = "2,5-7"

The publisher waits for one subscriber, publishes COUNT messages round robin over tags
0..9 (each payload: its tag and sequence number as little-endian u64s, then 48 bytes) and
closes, saying goodbye. The subscriber takes everything until the publisher has closed and
prints one JSON line: messages per tag, missed (gaps), whether every tag's sequence numbers
came in order, and the goodbye's reason.
"""

import json
import struct
import sys

import evb


def publish(count: int, transport: str) -> None:
    p = evb.Publisher("127.0.0.1:0", transport=transport, policy="block")
    print(f"listening on {p.address}", flush=True)
    p.wait_subscribers(1, timeout=60)
    for i in range(count):
        tag, seq = i % 10, i // 10
        p.publish(tag, struct.pack("<QQ", tag, seq) + bytes(48))
    stats = p.close("the example publisher is done")
    print(json.dumps(stats))


def subscribe(addr: str, tags: str, transport: str) -> None:
    s = evb.Subscriber(addr, tags, transport=transport, delivery="throughput")
    received: dict[int, int] = {}  # messages per tag
    nxt: dict[int, int] = {}  # the next sequence number expected per tag
    missed = 0
    in_order = True
    goodbye: str | None = None
    for m in s:  # until the publisher has closed
        if isinstance(m, evb.Message):
            in_order &= struct.unpack("<QQ", m.payload[:16]) == (m.tag, m.seq)
            in_order &= m.seq == nxt.get(m.tag, 0)
            nxt[m.tag] = m.seq + 1
            received[m.tag] = received.get(m.tag, 0) + 1
        elif isinstance(m, evb.Gap):
            missed += m.missed
            nxt[m.tag] = nxt.get(m.tag, 0) + m.missed
        elif isinstance(m, evb.Goodbye):
            goodbye = m.reason
    print(json.dumps({"received": received, "missed": missed, "in_order": in_order,
                      "goodbye": goodbye}))


def main(argv: list[str]) -> None:
    if len(argv) >= 3 and argv[1] == "pub":
        publish(int(argv[2]), argv[3] if len(argv) > 3 else "tcp")
    elif len(argv) >= 4 and argv[1] == "sub":
        subscribe(argv[2], argv[3], argv[4] if len(argv) > 4 else "tcp")
    else:
        sys.exit("usage: pubsub.py pub COUNT [TRANSPORT] | pubsub.py sub ADDR TAGS [TRANSPORT]")


if __name__ == "__main__":
    main(sys.argv)
