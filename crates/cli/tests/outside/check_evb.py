#!/usr/bin/env python3
"""Checks a run's built-event files, written from docs/formats.md alone.

Reads every `.evb` file of a folder that has its `.evb.json` beside it (temporary files and
others are skipped), checks the file header, each event's header and body CRC32C, each
fragment header's and payload's CRC32C, and each generated payload byte by byte
(docs/formats.md §5) with the run's seed. Prints one JSON line: events read, distinct ids,
ids seen twice, and the problems found (at most 20 named).
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ru import crc32c  # noqa: E402  (CRC32C, Castagnoli, from docs/protocol.md)

M64 = (1 << 64) - 1
STEP = 0x9E3779B97F4A7C15
GENERATED = 1 << 1


def mix(z):
    z = (z + STEP) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def expected(seed, event_id, source_id, size, static):
    key = mix(seed ^ mix((0 if static else event_id) ^ (source_id << 48)))
    words = (size + 7) // 8
    data = b"".join(struct.pack("<Q", (key + i * STEP) & M64) for i in range(words))
    return data[:size]


def check_file(path, meta, seed, static, seen, problems):
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    magic, version, bu, seq, run_len, reserved = struct.unpack_from("<4sHHIHH", data)
    if magic != b"EVBE" or version != 1 or reserved != 0:
        problems.append(f"{name}: bad file header")
        return 0
    run = data[16:16 + run_len].decode()
    if run != meta["run"] or bu != meta["bu"] or seq != meta["sequence"]:
        problems.append(f"{name}: header says run {run} bu {bu} sequence {seq}, metadata not")
    at, events, ids = 16 + run_len, 0, []
    while at < len(data):
        magic, blen, eid, trig, nfrag, flags, body_crc, head_crc = struct.unpack_from(
            "<4sIQIHHII", data, at)
        if magic != b"EVEV" or crc32c(data[at:at + 28]) != head_crc:
            problems.append(f"{name}: bad event header at byte {at}")
            return events
        body = data[at + 32:at + 32 + blen]
        if crc32c(body) != body_crc:
            problems.append(f"event {eid}: body CRC")
        if trig != eid & 0xFFFFFFFF or flags != 0:
            problems.append(f"event {eid}: trigger number {trig}, flags {flags}")
        off = 0
        for _ in range(nfrag):
            fid, ftrig, src, fflags, size, pcrc, res, hcrc = struct.unpack_from(
                "<QIHHIIII", body, off)
            payload = body[off + 32:off + 32 + size]
            if crc32c(body[off:off + 28]) != hcrc or res != 0 or fid != eid:
                problems.append(f"event {eid}: bad fragment header from source {src}")
            elif crc32c(payload) != pcrc:
                problems.append(f"event {eid}: payload CRC of source {src}")
            elif not fflags & GENERATED:
                problems.append(f"event {eid}: source {src} not flagged GENERATED")
            elif payload != expected(seed, eid, src, size, static):
                problems.append(f"event {eid}: payload bytes of source {src}")
            off += 32 + size
        if off != blen:
            problems.append(f"event {eid}: fragments do not fill the body")
        ids.append(eid)
        if eid in seen:
            problems.append(f"event {eid}: seen twice")
        seen.add(eid)
        events += 1
        at += 32 + blen
    if events != meta["events"] or ids[:1] != [meta["first_event"]] or \
            ids[-1:] != [meta["last_event"]] or crc32c(data) != meta["crc32c"]:
        problems.append(f"{name}: metadata disagrees with the file")
    return events


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--static", action="store_true")
    a = p.parse_args()
    seen, problems, events, twice = set(), [], 0, 0
    for name in sorted(os.listdir(a.dir)):
        path = os.path.join(a.dir, name)
        if not name.endswith(".evb") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path + ".json") as f:
            meta = json.load(f)
        before = len(problems)
        events += check_file(path, meta, a.seed, a.static, seen, problems)
        twice += sum(1 for x in problems[before:] if x.endswith("seen twice"))
    print(json.dumps({"events": events, "ids": len(seen), "twice": twice,
                      "problems": len(problems), "first_problems": problems[:20]}))


if __name__ == "__main__":
    main()
