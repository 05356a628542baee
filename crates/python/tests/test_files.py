"""Reading evb's output from Python: `evb.EventFile` (events of `.evb` files, fragments as
numpy arrays in place in the mapped file) and `evb.judge_run` (a run judged complete from
its folder by its manifest), against files that `evb run` wrote."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import evb
from conftest import ROOT, evb_bin, free_base_port

sys.path.insert(0, str(ROOT / "crates" / "cli" / "tests" / "outside"))
from check_evb import expected  # noqa: E402  (the generator's bytes, docs/formats.md §5)

EVENTS = 900


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2 RU x 2 BU run of generated events into .evb files (seed 5)."""
    d = tmp_path_factory.mktemp("files")
    out = d / "out"
    base = free_base_port(12)
    (d / "run.toml").write_text(
        f'[run]\nid = "py"\nevents = {EVENTS}\nduration_s = 0\nseed = 5\n'
        f"[topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {base + 6}\n"
        f'[fragments]\nsize = 700\ndistribution = "lognormal"\n'
        f'[sink]\nkind = "file"\ndir = "{out}"\nfile_max_events = 200\n')
    r = subprocess.run([evb_bin(), "run", "--config", str(d / "run.toml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def files_in(out):
    return sorted(p for p in out.iterdir() if p.suffix == ".evb" and not p.name.startswith("."))


@pytest.mark.parametrize("mmap", [True, False])
def test_every_event_and_byte_of_a_run_read_as_numpy_arrays(run_dir, mmap):
    seen = set()
    for path in files_in(run_dir):
        f = evb.EventFile(path, mmap=mmap)
        meta = json.loads(path.with_name(path.name + ".json").read_text())
        assert (f.run, f.bu, f.sequence, len(f)) == ("py", meta["bu"], meta["sequence"],
                                                     meta["events"])
        assert f.event_ids()[0] == meta["first_event"] and f.event_ids()[-1] == meta["last_event"]
        for ev in f:
            assert ev.event_id not in seen
            seen.add(ev.event_id)
            assert ev.trigger_number == ev.event_id & 0xFFFFFFFF and not ev.partial
            assert len(ev) == 2
            for frag in ev.fragments:
                a = np.frombuffer(frag, dtype=np.uint8)
                assert a.size == len(frag) and not a.flags.writeable
                assert evb.crc32c(a) == frag.payload_crc
                assert a.tobytes() == expected(5, ev.event_id, frag.source_id, len(frag), False)
                assert frag.tobytes() == a.tobytes()
        # by id and by index, the same event
        last = f[-1]
        assert f.event(last.event_id).event_id == last.event_id
        with pytest.raises(KeyError):
            f.event(10**12)
        with pytest.raises(IndexError):
            f[len(f)]
    assert seen == set(range(EVENTS))


def test_mapped_fragments_are_in_place_not_copies(run_dir):
    f = evb.EventFile(files_in(run_dir)[0])
    # the fragment read twice, as two objects: both arrays lie on the same bytes of the
    # mapping (a copy would have an address of its own)
    a = np.frombuffer(f[0].fragments[0], dtype=np.uint8)
    b = np.frombuffer(f.event(f[0].event_id).fragments[0], dtype=np.uint8)
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    with pytest.raises(TypeError, match="read-only"):
        memoryview(f[0].fragments[0])[0] = 0


def test_a_damaged_file_is_refused_with_the_byte_named(run_dir, tmp_path):
    src = files_in(run_dir)[0]
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.evb"
    bad.write_bytes(bytes(data))
    with pytest.raises(evb.FormatError, match="at byte"):
        evb.EventFile(bad)
    (tmp_path / "not.evb").write_bytes(b"hello")
    with pytest.raises(evb.FormatError, match="magic"):
        evb.EventFile(tmp_path / "not.evb")
    with pytest.raises(OSError):
        evb.EventFile(tmp_path / "absent.evb")


def test_judge_run_says_complete_and_names_a_deleted_files_ids(run_dir, tmp_path):
    j = evb.judge_run(run_dir)
    assert j["complete"] and j["verdict"] == "OK", j
    assert (j["triggered"], j["released"], j["events"]) == (EVENTS, EVENTS, EVENTS)
    # a copy of the folder without one file
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in run_dir.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    gone = files_in(copy)[1]
    first, count = json.loads(gone.with_name(gone.name + ".json").read_text())["ranges"][0]
    gone.unlink()
    j = evb.judge_run(copy)
    assert not j["complete"] and j["bad_files"] == [gone.name], j
    assert (first, first + count - 1) in [tuple(r) for r in j["missing"]], j


CMS = ROOT.parent / "shared" / "data" / "cms"


def cms_run(tmp, name, compress):
    out = tmp / name
    files = sorted(CMS.glob("*.raw"))
    toml = (f'[run]\nid = "{name}"\nduration_s = 0\n[source]\nkind = "fed"\n'
            f'[topology]\nbus = 2\nbase_port = {free_base_port(6)}\n'
            f'[sink]\nkind = "file"\ndir = "{out}"\nfile_max_events = 1000\n{compress}\n')
    for i, (src, f) in enumerate(zip((841, 843), files)):
        toml += f'[[ru]]\nid = "ru{i}"\nsource_id = {src}\nfiles = ["{f}"]\n'
    (tmp / f"{name}.toml").write_text(toml)
    r = subprocess.run([evb_bin(), "run", "--config", str(tmp / f"{name}.toml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    events = {}
    for path in files_in(out):
        for ev in evb.EventFile(path):
            events[ev.event_id] = [(f.source_id, f.tobytes()) for f in ev.fragments]
    return events


@pytest.mark.skipif(not CMS.exists(), reason="the recorded CMS files are not beside the checkout")
def test_zstd_compressed_files_read_as_the_plain_ones(tmp_path):
    plain = cms_run(tmp_path, "plain", "")
    packed = cms_run(tmp_path, "packed", 'compress = "zstd"')
    assert len(plain) == 4685
    assert packed == plain


def test_a_bad_configuration_is_a_config_error_naming_the_key(tmp_path):
    # not TOML at all, and TOML with a value evb refuses: both ConfigError (a SetupError)
    with pytest.raises(evb.ConfigError):
        evb.Consumer("[run\nid = \n", "bu0")
    with pytest.raises(evb.ConfigError, match="run.duration_s"):
        evb.Producer("[run]\nduration_s = -1\n[source]\nkind = \"api\"\n", "ru0")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sink]\nkind = \"file\"\n")
    with pytest.raises(evb.SetupError, match="sink.dir"):
        evb.Consumer(bad, "bu0")
    assert issubclass(evb.ConfigError, evb.SetupError)
