#!/usr/bin/env python3
"""Checks a run's HDF5 files in the packed layout with h5py and numpy, written from
docs/formats.md §12 alone.

Reads every published `.h5` file of a folder (one with its `.h5.json` beside it; temporary
files are skipped): the file attributes against the metadata, every row of the event and
fragment indexes and every invariant §12 states (events back to back from offset 0, the
fragment rows of each event following those of the events before it, lengths adding up),
each fragment's CRC32C over its bytes in `/data`, and each fragment's bytes, either against
the generator's pattern (docs/formats.md §5, `--seed`) or against the same run written as
`.evb` files (`--against DIR`: each event's trigger number and flags, each fragment's source
id, flags, payload CRC32C and bytes, in order). Prints one JSON line: events read, fragments,
distinct ids, ids seen twice, files, and the problems found (at most 20 named).
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

MISSING = 1 << 0
EVENT_COLUMNS = {"event_id": np.uint64, "offset": np.uint64, "length": np.uint32,
                 "trigger_number": np.uint32, "flags": np.uint16, "sources": np.uint16}
FRAGMENT_COLUMNS = {"offset": np.uint64, "event": np.uint32, "length": np.uint32,
                    "crc32c": np.uint32, "source_id": np.uint16, "flags": np.uint16}


def evb_events(folder):
    """{event id: (trigger, flags, [(source, flags, payload crc, payload)])} of every
    published .evb file in `folder` (docs/formats.md §3)."""
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
            _, blen, eid, trig, nfrag, flags = struct.unpack_from("<4sIQIHH", data, at)
            frags, off = [], at + 32
            for _ in range(nfrag):
                src, fflags, size, pcrc = struct.unpack_from("<HHII", data, off + 12)
                frags.append((src, fflags, pcrc, data[off + 32:off + 32 + size]))
                off += 32 + size
            out[eid] = (trig, flags, frags)
            at += 32 + blen
    return out


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def column(group, name, dtype, problems, fname):
    ds = group[name]
    if ds.dtype != np.dtype(dtype) or len(ds.shape) != 1:
        problems.append(f"{fname}: {group.name}/{name} is {ds.dtype} {ds.shape}, "
                        f"§12 says {np.dtype(dtype)} [n]")
    return np.asarray(ds[:], dtype=np.uint64).astype(np.int64)


def check_file(path, meta, a, reference, seen, problems):
    name = os.path.basename(path)
    with h5py.File(path, "r") as f:
        at = {k: f.attrs[k] for k in f.attrs}
        if text(at["format"]) != "evb-hdf5-packed" or int(at["format_version"]) != 1 or \
                text(at["layout"]) != "packed" or text(at["record_type"]) != "event":
            problems.append(f"{name}: format attributes")
        if text(at["run"]) != meta["run"] or int(at["bu"]) != meta["bu"] or \
                int(at["sequence"]) != meta["sequence"]:
            problems.append(f"{name}: attributes disagree with the metadata")
        if meta["format"] != "evb-hdf5-packed" or meta["version"] != 1:
            problems.append(f"{name}: metadata format {meta['format']} {meta['version']}")
        ds = f["data"]
        # chunks of 65,536 bytes, or one chunk of the whole data in a file of one batch
        if ds.dtype != np.uint8 or len(ds.shape) != 1 or ds.maxshape != (None,) or \
                ds.chunks not in ((65536,), (max(ds.shape[0], 1),)):
            problems.append(f"{name}: data is {ds.dtype} {ds.shape} max {ds.maxshape} "
                            f"chunks {ds.chunks}")
        if (a.deflate and ds.compression != "gzip") or (not a.deflate and ds.compression):
            problems.append(f"{name}: data compression {ds.compression}")
        data = ds[:].tobytes()
        ev = {k: column(f["events"], k, t, problems, name) for k, t in EVENT_COLUMNS.items()}
        fr = {k: column(f["fragments"], k, t, problems, name)
              for k, t in FRAGMENT_COLUMNS.items()}
    n_events, n_frags = len(ev["event_id"]), len(fr["offset"])
    if any(len(c) != n_events for c in ev.values()) or \
            any(len(c) != n_frags for c in fr.values()):
        problems.append(f"{name}: index columns of unequal lengths")
        return 0, 0, 0, 0
    if int(at["events"]) != n_events or int(at["payload_bytes"]) != len(data):
        problems.append(f"{name}: attributes events/payload_bytes disagree with the datasets")
    if n_frags != int(ev["sources"].sum()):
        problems.append(f"{name}: {n_frags} fragment rows, the events have "
                        f"{int(ev['sources'].sum())}")
        return 0, 0, 0, 0
    # events back to back from 0 to the end of the data
    ends = np.cumsum(ev["length"])
    starts = np.concatenate(([0], ends[:-1])) if n_events else ends
    if not np.array_equal(ev["offset"], starts) or (n_events and ends[-1] != len(data)):
        problems.append(f"{name}: events are not back to back over the data")
    # each event's fragment rows: its own, in order, from its offset, adding up to its length
    owner = np.repeat(np.arange(n_events), ev["sources"])
    if not np.array_equal(fr["event"], owner):
        problems.append(f"{name}: fragment rows do not follow their events")
    first = np.concatenate(([0], np.cumsum(ev["sources"])[:-1])) if n_events else owner
    within = np.cumsum(fr["length"]) - fr["length"]          # bytes before each, in the file
    expect = ev["offset"][owner] + within - (within[first][owner] if n_frags else 0)
    if not np.array_equal(fr["offset"], expect):
        problems.append(f"{name}: fragment offsets are not their event's, back to back")
    sums = np.bincount(owner, weights=fr["length"], minlength=n_events)
    if not np.array_equal(sums.astype(np.int64), ev["length"]):
        problems.append(f"{name}: fragment lengths do not add up to their events'")
    payload_total = 0
    for i in range(n_events):
        eid = int(ev["event_id"][i])
        trig, eflags = int(ev["trigger_number"][i]), int(ev["flags"][i])
        rows = range(int(first[i]), int(first[i]) + int(ev["sources"][i]))
        frags = []
        for j in rows:
            o, n = int(fr["offset"][j]), int(fr["length"][j])
            payload = data[o:o + n]
            src, fflags, pcrc = int(fr["source_id"][j]), int(fr["flags"][j]), int(fr["crc32c"][j])
            if crc32c(payload) != pcrc:
                problems.append(f"event {eid}: source {src}'s CRC32C does not match its bytes")
            if fflags & MISSING and n != 0:
                problems.append(f"event {eid}: MISSING source {src} has {n} bytes")
            frags.append((src, fflags, pcrc, payload))
        body = data[int(ev["offset"][i]):int(ev["offset"][i]) + int(ev["length"][i])]
        if body != b"".join(p for _, _, _, p in frags):
            problems.append(f"event {eid}: its bytes are not its fragments'")
        if reference is not None:
            want = reference.get(eid)
            if want is None:
                problems.append(f"event {eid}: not in the .evb run")
            elif (trig, eflags) != want[:2]:
                problems.append(f"event {eid}: trigger/flags {trig}/{eflags}, .evb "
                                f"{want[0]}/{want[1]}")
            elif [f[:3] for f in frags] != [f[:3] for f in want[2]]:
                problems.append(f"event {eid}: fragment fields differ from the .evb run")
            elif [f[3] for f in frags] != [f[3] for f in want[2]]:
                problems.append(f"event {eid}: payload differs from the .evb run")
        else:
            if trig != eid & 0xFFFFFFFF:
                problems.append(f"event {eid}: trigger number {trig}")
            for src, fflags, _, payload in frags:
                if not fflags & GENERATED:
                    problems.append(f"event {eid}: source {src} not flagged GENERATED")
                elif payload != expected(a.seed, eid, src, len(payload), a.static):
                    problems.append(f"event {eid}: payload bytes of source {src}")
        payload_total += len(body)
        if eid in seen:
            problems.append(f"event {eid}: seen twice")
        seen.add(eid)
    ids = ev["event_id"].tolist()
    if n_events != meta["events"] or payload_total != meta["payload_bytes"] or \
            ids[:1] != [meta["first_event"]] or ids[-1:] != [meta["last_event"]]:
        problems.append(f"{name}: metadata disagrees with the file")
    if os.path.getsize(path) != meta["bytes"]:
        problems.append(f"{name}: {os.path.getsize(path)} bytes, metadata says {meta['bytes']}")
    partial = int(np.count_nonzero(ev["flags"] & 1))
    missing = int(np.count_nonzero(fr["flags"] & MISSING))
    return n_events, n_frags, partial, missing


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--static", action="store_true")
    p.add_argument("--deflate", action="store_true", help="the data must be deflated")
    p.add_argument("--against", help="a folder of .evb files of the same events")
    a = p.parse_args()
    reference = evb_events(a.against) if a.against else None
    seen, problems, events, frags, twice, files, size, payload = set(), [], 0, 0, 0, 0, 0, 0
    partial = missing = 0
    for name in sorted(os.listdir(a.dir)):
        path = os.path.join(a.dir, name)
        if not name.endswith(".h5") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path + ".json") as f:
            meta = json.load(f)
        before = len(problems)
        e, n, p_, m = check_file(path, meta, a, reference, seen, problems)
        events, frags, partial, missing = events + e, frags + n, partial + p_, missing + m
        twice += sum(1 for x in problems[before:] if x.endswith("seen twice"))
        files += 1
        size += os.path.getsize(path)
        payload += meta["payload_bytes"]
    if reference is not None and set(reference) != seen:
        problems.append(f"the .evb run has {len(reference)} ids, the HDF5 files {len(seen)}")
    print(json.dumps({"events": events, "fragments": frags, "ids": len(seen), "twice": twice,
                      "partial": partial, "missing": missing, "files": files, "bytes_per_payload_byte": size / payload if payload else 0,
                      "problems": len(problems), "first_problems": problems[:20]}))


if __name__ == "__main__":
    main()
