#!/usr/bin/env python3
"""Checks a run built by time (builder.by = "time"), written from docs/formats.md alone.

Reads every `.evb` file of a folder that has its `.evb.json` beside it (§3), takes every
record as time slice k of `--slice` ticks with `--overlap` (§8), and every fragment as a
window fragment of time frames (docs/protocol.md §10.1-10.2). It checks each record's
window, every frame's CRC and source, every generated frame's bytes (§5, keyed by the
frame's index), and then the streams: per source, the frames of the slices' cores, in
tick order, must begin at tick 0 and follow one another without gap or repeat up to the
end of the last slice, and each slice's overlap must be the next slice's first frames,
byte for byte. Prints one JSON line: records, sources, core frames and payload bytes per
source, overlap frames checked, and the problems (at most 20 named).
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_evb import expected  # noqa: E402  (the generator's pattern, §5)
from ru import crc32c  # noqa: E402  (CRC32C, Castagnoli, from docs/protocol.md)

WINDOW = 1 << 4  # fragment flag: the payload is a window fragment
SUPER = 1 << 2  # fragment flag: the payload is a super-fragment (here: of window fragments)
MISSING = 1
FRAME_GENERATED = 1


def window_frames(payload, problems, where, statuses=False):
    """A window fragment's window (begin, end, core end, and with `statuses` its status; a
    time slice's must be 0, complete) and frames (begin, end, source, flags, their bytes)."""
    begin, end, core_end, status, reserved, n = struct.unpack_from("<QQQHHI", payload)
    if reserved != 0 or status > 3 or (status != 0 and not statuses):
        problems.append(f"{where}: status {status}, reserved {reserved}")
    window = (begin, end, core_end, status) if statuses else (begin, end, core_end)
    body = 32 + 8 * n
    frames, next_off = [], 0
    for i in range(n):
        off, length = struct.unpack_from("<II", payload, 32 + 8 * i)
        if off != next_off:
            problems.append(f"{where}: frame {i} at offset {off}, not {next_off}")
            return window, []
        raw = payload[body + off:body + off + length]
        fb, fe, src, flags, crc = struct.unpack_from("<QQHHI", raw)
        if crc32c(raw[:20] + raw[24:]) != crc:
            problems.append(f"{where}: frame [{fb}, {fe}) CRC")
        frames.append((fb, fe, src, flags, raw))
        next_off = off + length
    if body + next_off != len(payload):
        problems.append(f"{where}: frames do not fill the fragment")
    return window, frames


def entries(src, flags, payload):
    """A fragment's window fragments: itself, or each entry of a super-fragment of them (an
    RU of several streams, §4: magic EVSF, version, count, 16-byte entries), with the
    entry's source id."""
    if not flags & SUPER or flags & MISSING:
        return [(src, flags, payload)]
    magic, version, k = struct.unpack_from("<4sHH", payload)
    if magic != b"EVSF" or version != 1:
        return [(src, flags & ~SUPER, b"")]
    out, at = [], 8 + 16 * k
    for i in range(k):
        esrc, eflags, _, length, _ = struct.unpack_from("<HHIII", payload, 8 + 16 * i)
        out.append((esrc, WINDOW | (MISSING if eflags & 1 else 0), payload[at:at + length]))
        at += length
    return out


def records(folder):
    """Every record of the folder's files: (id, [(source, flags, payload)]), a
    super-fragment's entries each a fragment of its own."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith(".evb") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path, "rb") as f:
            data = f.read()
        at = 16 + struct.unpack_from("<H", data, 12)[0]
        while at < len(data):
            _, blen, eid, _, nfrag = struct.unpack_from("<4sIQIH", data, at)
            body, off, frags = data[at + 32:at + 32 + blen], 0, []
            for _ in range(nfrag):
                _, _, src, flags, size = struct.unpack_from("<QIHHI", body, off)
                frags += entries(src, flags, body[off + 32:off + 32 + size])
                off += 32 + size
            yield eid, frags
            at += 32 + blen


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slice", type=int, required=True, help="builder.slice_ticks")
    p.add_argument("--overlap", type=int, required=True, help="builder.overlap_ticks")
    p.add_argument("--frame", type=int, required=True, help="frames.ticks")
    p.add_argument("--static", action="store_true", help='frames.content = "static"')
    p.add_argument("--t0", type=int, default=0, help="frames.first_tick: the run's first tick")
    a = p.parse_args()
    problems, cores, overlaps, seen = [], {}, {}, set()
    for k, frags in records(a.dir):
        if k in seen:
            problems.append(f"record {k}: seen twice")
        seen.add(k)
        want = (a.t0 + k * a.slice, a.t0 + (k + 1) * a.slice + a.overlap,
                a.t0 + (k + 1) * a.slice)
        for src, flags, payload in frags:
            where = f"record {k} source {src}"
            if not flags & WINDOW:
                problems.append(f"{where}: not a window fragment")
                continue
            window, frames = window_frames(payload, problems, where)
            if window != want:
                problems.append(f"{where}: window {window}, not {want}")
            for fb, fe, fsrc, fflags, raw in frames:
                if fsrc != src or not want[0] <= fb < want[1] or fe - fb != a.frame:
                    problems.append(f"{where}: frame [{fb}, {fe}) of source {fsrc}")
                elif fflags & FRAME_GENERATED and \
                        raw[24:] != expected(a.seed, fb // a.frame, src, len(raw) - 24, a.static):
                    problems.append(f"{where}: frame [{fb}, {fe}) payload bytes")
                if fb < want[2]:
                    cores.setdefault(src, []).append((fb, fe, raw))
                else:
                    overlaps.setdefault(src, []).append((k, fb, raw))
    n = len(seen)
    if seen != set(range(n)):
        problems.append(f"records are not 0 .. {n - 1}")
    stats = {}
    for src, frames in sorted(cores.items()):
        frames.sort(key=lambda f: f[0])
        tick = a.t0
        for fb, fe, _ in frames:
            if fb != tick:
                problems.append(f"source {src}: stream has {'a repeat' if fb < tick else 'a gap'}"
                                f" at tick {tick}")
                break
            tick = fe
        if tick < a.t0 + n * a.slice:
            problems.append(f"source {src}: cores end at tick {tick}, "
                            f"slices at {a.t0 + n * a.slice}")
        stats[src] = {"core_frames": len(frames),
                      "core_bytes": sum(len(raw) - 24 for _, _, raw in frames)}
    by_begin = {src: {fb: raw for fb, _, raw in f} for src, f in cores.items()}
    checked = 0
    for src, over in overlaps.items():
        for k, fb, raw in over:
            if k + 1 >= n:
                continue  # the last slice's overlap: no slice after it in this run
            checked += 1
            if by_begin.get(src, {}).get(fb) != raw:
                problems.append(f"source {src}: record {k}'s overlap frame at {fb} is not "
                                f"record {k + 1}'s")
    print(json.dumps({"records": n, "sources": stats, "overlap_frames": checked,
                      "problems": len(problems), "first_problems": problems[:20]}))


if __name__ == "__main__":
    main()
