"""A consumer in Python taking one BU's built events through evb's plug-in API.

    evb node --config run.toml --id evm &      # and every RU and other BU, as processes
    python consumer.py run.toml bu0

The BU's sink is "api". Every fragment's payload is read in place from the BU's pool (a
memoryview, no copy) and its CRC32C checked against its header; at the end one JSON line:
{"events": N, "bytes": B, "bad_crc": 0, "ok": true}.
"""

import json
import sys

import evb


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: consumer.py CONFIG BU_ID")
    consumer = evb.Consumer(argv[1], argv[2], max_held=8)
    events = nbytes = bad = 0
    for event in consumer:  # ends when the run is over
        with event:  # released (its blocks back to the BU) at the end of the block
            for fragment in event.fragments:
                with memoryview(fragment) as payload:  # in place, read-only
                    if evb.crc32c(payload) != fragment.payload_crc:
                        bad += 1
                    nbytes += len(payload)
        events += 1
    outcome = consumer.finish()
    print(json.dumps({"events": events, "bytes": nbytes, "bad_crc": bad, "ok": outcome.ok,
                      "reason": outcome.reason}), flush=True)
    if not outcome.ok or bad:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
