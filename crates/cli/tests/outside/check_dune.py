#!/usr/bin/env python3
"""Checks HDF5 files in DUNE's layout with h5py and struct, written from DUNE's published
layout alone: daqdataformats (FragmentHeader v5, TriggerRecordHeaderData v4,
ComponentRequest v2, TimeSliceHeader v2, SourceID v2) and hdf5libs v2.8.0 (file layout
version 5: group and dataset names, file and record attributes).

Reads every published `.h5` file of a folder (one with its `.h5.json` beside it): the file
attributes, each record's group name, its header (magic, version, number, run, its
component requests against the fragments present), each fragment's header (magic, version,
size, number, run, window, SourceID against the dataset's name) and hdf5libs' record maps.
With `--against DIR` it compares every fragment's payload byte for byte with the same run
written as `.evb` files (read from docs/formats.md §3, §4: an RU's super-fragment is one
fragment per stream), and the error bits with the window status each evb window fragment
states (docs/protocol.md §10.2: LATE → kIncomplete, MISSING → kDataNotFound, an EMPTY one
not requested at all). Prints one JSON line: records, fragments, problems (at most 20).
"""

import argparse
import json
import os
import re
import struct
import sys

import h5py
import numpy as np

SUBSYSTEMS = {1: "Detector_Readout", 4: "TR_Builder"}
FRAGMENT = "<IIQQQQQIIIHH"  # then the SourceID: version u16, subsystem u16, id u32
SOURCE_ID = "<HHI"
DATA_NOT_FOUND, INCOMPLETE = 1 << 0, 1 << 1
FLAG_MISSING, FLAG_SUPER, FLAG_WINDOW = 0x1, 0x4, 0x10


def evb_fragments(folder):
    """{(event id, source id): (payload, window status or None, missing)} of every published
    .evb file in `folder`, super-fragments split into their streams."""
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
                src, flags, size = struct.unpack_from("<HHI", data, off + 12)
                payload = data[off + 32:off + 32 + size]
                parts = [(src, payload, bool(flags & FLAG_MISSING))]
                if flags & FLAG_SUPER:
                    k = struct.unpack_from("<H", data, off + 32 + 6)[0]
                    p, parts = 8 + 16 * k, []
                    for i in range(k):
                        s, ef, _, n = struct.unpack_from("<HHII", payload, 8 + 16 * i)
                        parts.append((s, payload[p:p + n], bool(ef & 1)))
                        p += n
                for s, part, missing in parts:
                    status = None
                    if flags & FLAG_WINDOW and len(part) >= 32:
                        status = struct.unpack_from("<H", part, 24)[0]
                    out[(eid, s)] = (part, status, missing)
                off += 32 + size
            at += 32 + blen
    return out


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def source_id(raw):
    version, subsys, sid = struct.unpack(SOURCE_ID, raw)
    return version, subsys, sid


def sid_name(subsys, sid):
    return "%s_0x%08x" % (SUBSYSTEMS.get(subsys, "Unknown"), sid)


def as_bytes(ds):
    arr = np.asarray(ds)
    if arr.dtype != np.int8 or arr.ndim != 2 or arr.shape[1] != 1:
        raise ValueError(f"{ds.name}: {arr.dtype} {arr.shape}, not hdf5libs' char [n, 1]")
    return arr.tobytes()


def check_file(path, meta, reference, seen, problems, counts):
    name = os.path.basename(path)
    with h5py.File(path, "r") as f:
        a = f.attrs
        params = json.loads(text(a["filelayout_params"]))
        rtype = text(a["record_type"])
        if int(a["filelayout_version"]) != 5 or rtype not in ("TriggerRecord", "TimeSlice") \
                or params["record_name_prefix"] != rtype:
            problems.append(f"{name}: layout attributes {rtype}, {dict(params)}")
            return
        run = int(a["run_number"])
        if int(a["file_index"]) != meta["sequence"]:
            problems.append(f"{name}: file_index {int(a['file_index'])}")
        for t in ("creation_timestamp", "closing_timestamp"):
            if not text(a[t]).isdigit():
                problems.append(f"{name}: {t} {a[t]!r}")
        if not text(a["application_name"]):
            problems.append(f"{name}: no application_name")
        seq_digits = params["digits_for_sequence_number"]
        header_name = params["record_header_dataset_name"]
        raw_name = params["raw_data_group_name"]
        pattern = re.compile(r"^%s(\d{%d,})%s$" % (
            rtype, params["digits_for_record_number"],
            r"\.(\d{%d})" % seq_digits if seq_digits else ""))
        recorded = 0
        for gname in f.keys():
            m = pattern.match(gname)
            if not m:
                problems.append(f"{name}: group {gname} is not a {rtype}")
                continue
            number = int(m.group(1))
            raw = f[gname][raw_name]
            heads = [k for k in raw.keys() if k.endswith("_" + header_name)]
            if len(heads) != 1:
                problems.append(f"{gname}: header datasets {heads}")
                continue
            head = as_bytes(raw[heads[0]])
            recorded += len(head)
            requested = None
            if rtype == "TriggerRecord":
                magic, version, trig, ts, ncomp, hrun, errs, ttype, seq, maxseq, _ = \
                    struct.unpack_from("<IIQQQIIQHHI", head)
                _, hsub, hid = source_id(head[56:64])
                if (magic, version, trig, hrun, seq) != (0x33334444, 4, number, run, 0) or \
                        len(head) != 64 + 32 * ncomp:
                    problems.append(f"{gname}: trigger record header {magic:#x} v{version} "
                                    f"number {trig} run {hrun} of {len(head)} bytes")
                    continue
                requested = {}
                for i in range(ncomp):
                    cv, _, cver, csub, cid, wb, we = struct.unpack_from(
                        "<IIHHIQQ", head, 64 + 32 * i)
                    requested[(csub, cid)] = (wb, we)
                record_incomplete = errs & 1
            else:
                magic, version, tsn, hrun, _ = struct.unpack_from("<IIQII", head)
                _, hsub, hid = source_id(head[24:32])
                if (magic, version, tsn, hrun) != (0x55556666, 2, number, run):
                    problems.append(f"{gname}: time slice header {magic:#x} v{version}")
                    continue
            if heads[0] != sid_name(hsub, hid) + "_" + header_name:
                problems.append(f"{gname}: header named {heads[0]}")
            paths = {(e["subsys"], e["id"]): e["path"] for e in
                     json.loads(text(f[gname].attrs["source_id_path_map"]))["map_entries"]}
            if paths.get((hsub, hid)) != f"/{gname}/{raw_name}/{heads[0]}":
                problems.append(f"{gname}: source_id_path_map lacks the header")
            present = set()
            any_error = 0
            for dname in raw.keys():
                if dname in heads:
                    continue
                d = as_bytes(raw[dname])
                recorded += len(d)
                (magic, version, size, trig, ts, wb, we, frun, errs, ftype, seq, det) = \
                    struct.unpack_from(FRAGMENT, d)
                _, sub, sid = source_id(d[64:72])
                payload = d[72:]
                counts["fragments"] += 1
                any_error |= errs
                if (magic, version, size, trig, frun, seq) != \
                        (0x11112222, 5, len(d), number, run, 0):
                    problems.append(f"{gname}/{dname}: fragment header {magic:#x} v{version} "
                                    f"size {size} of {len(d)}, number {trig}, run {frun}")
                    continue
                if not dname.startswith(sid_name(sub, sid) + "_"):
                    problems.append(f"{gname}/{dname}: SourceID {sub}/{sid}")
                if paths.get((sub, sid)) != f"/{gname}/{raw_name}/{dname}":
                    problems.append(f"{gname}/{dname}: not in source_id_path_map")
                present.add((sub, sid))
                if requested is not None and requested.get((sub, sid)) != (wb, we):
                    problems.append(f"{gname}/{dname}: window {wb}..{we}, requested "
                                    f"{requested.get((sub, sid))}")
                if reference is None:
                    continue
                key = (number, sid)
                if key in seen:
                    problems.append(f"{gname}/{dname}: seen twice")
                seen.add(key)
                want = reference.get(key)
                if want is None:
                    problems.append(f"{gname}/{dname}: not in the .evb run")
                    continue
                part, status, missing = want
                if part != payload:
                    problems.append(f"{gname}/{dname}: payload differs from the .evb run")
                bits = (DATA_NOT_FOUND if missing or status == 2 else 0) | \
                    (INCOMPLETE if status == 1 else 0)
                if errs != bits:
                    problems.append(f"{gname}/{dname}: error bits {errs}, the .evb run "
                                    f"says {bits} (status {status}, missing {missing})")
                if status is not None and len(part) >= 16 and \
                        (wb, we) != struct.unpack_from("<QQ", part):
                    problems.append(f"{gname}/{dname}: window {wb}..{we}")
            if requested is not None:
                if set(requested) != present:
                    problems.append(f"{gname}: requested {sorted(requested)}, "
                                    f"present {sorted(present)}")
                if any_error and not record_incomplete:
                    problems.append(f"{gname}: a fragment in error, the record not incomplete")
            counts["records"] += 1
        if int(a["recorded_size"]) != recorded:
            problems.append(f"{name}: recorded_size {int(a['recorded_size'])}, "
                            f"datasets {recorded}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--against", help="a folder of .evb files of the same run's data")
    a = p.parse_args()
    reference = evb_fragments(a.against) if a.against else None
    seen, problems = set(), []
    counts = {"records": 0, "fragments": 0, "files": 0}
    for name in sorted(os.listdir(a.dir)):
        path = os.path.join(a.dir, name)
        if not name.endswith(".h5") or name.startswith(".") or \
                not os.path.exists(path + ".json"):
            continue
        with open(path + ".json") as f:
            meta = json.load(f)
        check_file(path, meta, reference, seen, problems, counts)
        counts["files"] += 1
    if reference is not None:
        # every fragment of the .evb run is in the DUNE files, but for EMPTY windows
        want = {k for k, (_, status, _) in reference.items() if status != 3}
        if want != seen:
            problems.append(f"the .evb run has {len(want)} requested fragments, the DUNE "
                            f"files {len(seen)}; e.g. {sorted(want ^ seen)[:5]}")
        counts["empty"] = sum(1 for (_, s, _) in reference.values() if s == 3)
        counts["late"] = sum(1 for (_, s, _) in reference.values() if s == 1)
        counts["missing"] = sum(1 for (_, s, m) in reference.values() if s == 2 or m)
    counts["problems"] = len(problems)
    counts["first_problems"] = problems[:20]
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
