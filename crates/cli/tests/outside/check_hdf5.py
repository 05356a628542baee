#!/usr/bin/env python3
"""Checks a run's HDF5 files with h5py, written from docs/formats.md §6 alone.

Reads every published `.h5` file of a folder (one with its `.h5.json` beside it; temporary
files are skipped): the file attributes against the metadata, the `Index` against the event
groups, each event's attributes and fragment headers (their CRC32C), and each fragment's
bytes, either against the generator's pattern (docs/formats.md §5, `--seed`) or against the
same run written as `.evb` files (`--against DIR`). Prints one JSON line: events read,
distinct ids, ids seen twice, and the problems found (at most 20 named).
"""

import argparse
import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_evb import GENERATED, expected  # noqa: E402  (the generator's bytes, §5)
from ru import crc32c  # noqa: E402  (CRC32C, Castagnoli, from docs/protocol.md)


def evb_fragments(folder):
    """{(event id, source id): payload} of every published .evb file in `folder` (§3)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith(".evb") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path, "rb") as f:
            data = f.read()
        at = 16 + struct.unpack_from("<H", data, 12)[0]
        while at < len(data):
            _, blen, eid = struct.unpack_from("<4sIQ", data, at)
            nfrag = struct.unpack_from("<H", data, at + 20)[0]
            off = at + 32
            for _ in range(nfrag):
                src, size = struct.unpack_from("<H2xI", data, off + 12)
                out[(eid, src)] = data[off + 32:off + 32 + size]
                off += 32 + size
            at += 32 + blen
    return out


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def check_file(path, meta, a, reference, seen, problems):
    name = os.path.basename(path)
    events = 0
    with h5py.File(path, "r") as f:
        attrs = f.attrs
        if text(attrs["format"]) != "evb-hdf5" or int(attrs["format_version"]) != 1 or \
                text(attrs["record_type"]) != "event":
            problems.append(f"{name}: format attributes")
        if text(attrs["run"]) != meta["run"] or int(attrs["bu"]) != meta["bu"] or \
                int(attrs["sequence"]) != meta["sequence"]:
            problems.append(f"{name}: attributes disagree with the metadata")
        ix = {k: np.asarray(f["Index"][k]) for k in
              ("event_id", "trigger_number", "flags", "fragments", "payload_bytes")}
        groups = sorted(k for k in f.keys() if k.startswith("Event"))
        if len(groups) != len(ix["event_id"]) or int(attrs["events"]) != len(groups):
            problems.append(f"{name}: {len(groups)} event groups, index of "
                            f"{len(ix['event_id'])}, attribute {int(attrs['events'])}")
        payload_total = 0
        for row, eid in enumerate(ix["event_id"].tolist()):
            gname = "Event%012d" % eid
            if gname not in f:
                problems.append(f"event {eid}: in the index, no group {gname}")
                continue
            g = f[gname]
            trig, flags = int(g.attrs["trigger_number"]), int(g.attrs["flags"])
            if int(g.attrs["event_id"]) != eid or trig != int(ix["trigger_number"][row]) or \
                    flags != int(ix["flags"][row]):
                problems.append(f"event {eid}: group attributes disagree with the index")
            heads = np.asarray(g["FragmentHeaders"], dtype=np.uint8)
            if heads.shape != (int(ix["fragments"][row]), 32):
                problems.append(f"event {eid}: fragment headers of shape {heads.shape}")
                continue
            size_sum = 0
            for h in heads:
                raw = h.tobytes()
                fid, ftrig, src, fflags, size, pcrc, res, hcrc = struct.unpack("<QIHHIIII", raw)
                payload = bytes(np.asarray(g["Source%05d" % src], dtype=np.uint8).tobytes())
                size_sum += len(payload)
                if crc32c(raw[:28]) != hcrc or res != 0 or fid != eid or ftrig != trig:
                    problems.append(f"event {eid}: bad fragment header of source {src}")
                elif len(payload) != size:
                    problems.append(f"event {eid}: source {src} has {len(payload)} bytes, "
                                    f"its header says {size}")
                elif reference is not None:
                    if reference.get((eid, src)) != payload:
                        problems.append(f"event {eid}: source {src} differs from the .evb run")
                elif not fflags & GENERATED:
                    problems.append(f"event {eid}: source {src} not flagged GENERATED")
                elif payload != expected(a.seed, eid, src, size, a.static):
                    problems.append(f"event {eid}: payload bytes of source {src}")
            if size_sum != int(ix["payload_bytes"][row]):
                problems.append(f"event {eid}: payload bytes disagree with the index")
            payload_total += size_sum
            if eid in seen:
                problems.append(f"event {eid}: seen twice")
            seen.add(eid)
            events += 1
        ids = ix["event_id"].tolist()
        if events != meta["events"] or payload_total != meta["payload_bytes"] or \
                ids[:1] != [meta["first_event"]] or ids[-1:] != [meta["last_event"]]:
            problems.append(f"{name}: metadata disagrees with the file")
    if os.path.getsize(path) != meta["bytes"]:
        problems.append(f"{name}: {os.path.getsize(path)} bytes, metadata says {meta['bytes']}")
    return events


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--static", action="store_true")
    p.add_argument("--against", help="a folder of .evb files of the same events")
    a = p.parse_args()
    reference = evb_fragments(a.against) if a.against else None
    seen, problems, events, twice, files = set(), [], 0, 0, 0
    for name in sorted(os.listdir(a.dir)):
        path = os.path.join(a.dir, name)
        if not name.endswith(".h5") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path + ".json") as f:
            meta = json.load(f)
        before = len(problems)
        events += check_file(path, meta, a, reference, seen, problems)
        twice += sum(1 for x in problems[before:] if x.endswith("seen twice"))
        files += 1
    if reference is not None and {e for e, _ in reference} != seen:
        problems.append(f"the .evb run has {len({e for e, _ in reference})} ids, "
                        f"the HDF5 files {len(seen)}")
    print(json.dumps({"events": events, "ids": len(seen), "twice": twice, "files": files,
                      "problems": len(problems), "first_problems": problems[:20]}))


if __name__ == "__main__":
    main()
