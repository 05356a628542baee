"""A readout producer in Python feeding one RU through evb's plug-in API.

    evb node --config run.toml --id evm &      # and every BU, as processes
    python producer.py run.toml ru0 100000 4096 [--copy]

run.toml says source.kind = "api". Each payload is written straight into the RU's pool
(zero copy, through numpy when it is installed, else a memoryview) and submitted with a
trigger number counting from 1; byte i of trigger t is (31 * t + i) % 256. With --copy the
payload is made first (a numpy array, else a bytearray) and handed to submit_copy (one copy).
"""

import sys
import time

import evb

try:
    import numpy as np
    import numpy.typing as npt
except ImportError:  # pragma: no cover - numpy is optional
    np = None  # type: ignore[assignment]


def pattern(trigger: int, size: int) -> bytes:
    """The payload of `trigger`, as bytes (for a check or for submit_copy)."""
    start = (31 * trigger) % 256
    block = bytes((start + i) % 256 for i in range(256))
    return (block * (size // 256 + 1))[:size]


def main(argv: list[str]) -> None:
    if len(argv) not in (5, 6) or (len(argv) == 6 and argv[5] != "--copy"):
        sys.exit("usage: producer.py CONFIG RU_ID EVENTS FRAGMENT_BYTES [--copy]")
    config, ru, events, size = argv[1], argv[2], int(argv[3]), int(argv[4])
    copy = len(argv) == 6
    producer = evb.Producer(config, ru)
    ramp: npt.NDArray[np.uint8] | None = None
    if np is not None:
        ramp = np.arange(size, dtype=np.uint64).astype(np.uint8)
    started = time.perf_counter()
    for trigger in range(1, events + 1):
        if copy:
            if ramp is not None:
                producer.submit_copy(np.add(ramp, (31 * trigger) % 256, dtype=np.uint8), trigger)
            else:
                producer.submit_copy(bytearray(pattern(trigger, size)), trigger)
            continue
        # waits while the RU's pool is full: back-pressure from the builder
        buf = producer.buffer(size)
        if ramp is not None:
            view = np.frombuffer(buf, dtype=np.uint8)  # the pool block, writable
            np.add(ramp, (31 * trigger) % 256, out=view, casting="unsafe")
            del view  # no view may be alive when the buffer is submitted
        else:
            memoryview(buf)[:] = pattern(trigger, size)
        producer.submit(buf, trigger)
    secs = time.perf_counter() - started
    print(f"submitted {events} fragments of {size} bytes in {secs:.2f} s: "
          f"{events / secs:.0f} fragments/s", flush=True)
    outcome = producer.finish()
    print(f"{ru}: {outcome.reason}", flush=True)
    if not outcome.ok:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
