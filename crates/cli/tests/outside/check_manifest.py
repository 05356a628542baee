#!/usr/bin/env python3
"""Judges a run's output folder from its run manifest, written from docs/formats.md §7 alone.

Reads `<run>.manifest.json` in the folder, checks that every file it lists is there with
its size and CRC32C, reads the event ids of every `.evb` file (§3) and compares them with
the ids the manifest lists for it, and then whether the ids of the intact files cover
`0 .. triggered` exactly once, the ids in none being exactly the events the manifest counts
as never released. Prints one JSON line: complete, the ids in no file and in two files as
[first, last] runs, the bad files, and the run's temporary files.
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ru import crc32c  # noqa: E402  (CRC32C, Castagnoli, from docs/protocol.md)


def evb_ids(path):
    with open(path, "rb") as f:
        data = f.read()
    at, ids = 16 + struct.unpack_from("<H", data, 12)[0], []
    while at < len(data):
        _, blen, eid = struct.unpack_from("<4sIQ", data, at)
        ids.append(eid)
        at += 32 + blen
    return ids


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--run", help="the run id (default: the folder's only manifest)")
    a = p.parse_args()
    names = [n for n in os.listdir(a.dir)
             if n.endswith(".manifest.json") and not n.startswith(".")]
    if a.run:
        names = [a.run + ".manifest.json"]
    if len(names) != 1:
        sys.exit(f"expected one manifest in {a.dir}, found {names}")
    with open(os.path.join(a.dir, names[0])) as f:
        m = json.load(f)
    assert m["format"] == "evb-run-manifest" and m["version"] == 1, m["format"]
    bad, spans = [], []
    for part in m["parts"]:
        path = os.path.join(a.dir, part["file"])
        if not os.path.exists(path):
            bad.append(part["file"])
            continue
        with open(path, "rb") as f:
            data = f.read()
        listed = [i for first, n in part["ranges"] for i in range(first, first + n)]
        if len(data) != part["bytes"] or crc32c(data) != part["crc32c"] or \
                (part["file"].endswith(".evb") and evb_ids(path) != listed):
            bad.append(part["file"])
            continue
        spans += [(first, first + n - 1) for first, n in part["ranges"] if n > 0]
    spans.sort()
    missing, twice, nxt = [], [], 0
    for first, last in spans:
        if first > nxt:
            missing.append([nxt, first - 1])
        if first < nxt:
            twice.append([first, min(last, nxt - 1)])
        nxt = max(nxt, last + 1)
    if nxt < m["triggered"]:
        missing.append([nxt, m["triggered"] - 1])
    in_none = sum(last - first + 1 for first, last in missing)
    prefix = "." + m["run"] + "_bu"
    temporaries = sorted(n for n in os.listdir(a.dir)
                         if n.startswith(prefix) and n.endswith(".tmp"))
    complete = not bad and not twice and nxt <= m["triggered"] and \
        in_none == m["triggered"] - m["released"]
    print(json.dumps({"complete": complete, "verdict": m["verdict"], "missing": missing,
                      "twice": twice, "bad_files": bad, "temporaries": temporaries}))


if __name__ == "__main__":
    main()
