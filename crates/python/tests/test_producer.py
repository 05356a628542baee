"""A Python producer feeding an RU in real multi-process runs (EVM and BUs as `evb node`
processes): exact counts and checksums at the BUs, zero-copy numpy writes, bad input
answered with clear exceptions."""

import re
import subprocess
import time

import numpy as np
import pytest

import evb
from conftest import assert_verdict_ok, evb_bin, free_base_port, pattern

API = '[run]\nid = "py"\nduration_s = 0\n[source]\nkind = "api"\nmax_fragment = 4096\n'


def payload(k):
    """Event k's payload: 0 to 3,999 bytes."""
    size = k * 397 % 4000
    return ((np.arange(size, dtype=np.uint64) * 7 + k * 131) % 256).astype(np.uint8)


def test_python_producer_feeds_an_ru_in_a_multi_process_run(run):
    events = 5000
    r = run(API + '[sink]\nkind = "file"\ndir = "out"\nfile_max_events = 2000\n'
            "[builder]\ncredits = 8\n[topology]\nrus = 1\nbus = 2\n", ["evm", "bu0", "bu1"])
    p = evb.Producer(str(r.config), "ru0")
    total = 0
    crcs = {}
    for k in range(events):
        data = payload(k)
        if k % 2:
            # any buffer-protocol object, one copy
            assert p.submit_copy(data if k % 4 == 1 else data.tobytes(), k + 1) == k
        else:
            # zero copy: numpy writes straight into the RU's pool block
            buf = p.buffer(len(data))
            view = np.frombuffer(buf, dtype=np.uint8)
            assert view.flags.writeable and len(view) == len(data)
            view[:] = data
            del view
            assert p.submit(buf, k + 1) == k
        crcs[k] = evb.crc32c(data)
        total += len(data)
    assert p.events_submitted == events
    ru = p.finish()
    assert ru.ok, ru.reason
    assert ru.report["stats"]["fragments_sent"] == events
    report = r.evm_report()
    assert_verdict_ok(report, events)
    assert sum(b["payload_bytes_built"] for b in report["run"]["bus"]) == total
    # the BUs' files: every event once, every checksum valid
    files = sorted(str(f) for f in (r.dir / "out").glob("*.evb"))
    assert files
    out = subprocess.run([evb_bin(), "inspect", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no event id appears twice" in out.stdout
    assert out.stdout.count("checksums: all valid") == len(files), out.stdout
    assert sum(int(n) for n in re.findall(r"^  (\d+) events", out.stdout, re.M)) == events
    # spot checks: the CRC in the file's header is the payload's the producer meant
    for k in (0, 1, 2, 3, 1234, events - 1):
        dump = subprocess.run([evb_bin(), "inspect", *files, "--event", str(k)],
                              capture_output=True, text=True).stdout
        assert f"{crcs[k]:08x}" in dump.lower(), (k, dump)


def test_python_producer_to_python_consumer_every_byte(run):
    events, size = 3000, 1000
    r = run(API + '[sink]\nkind = "api"\n[topology]\nrus = 1\nbus = 1\n', ["evm"])
    producer = r.python("producer.py", r.config, "ru0", events, size)
    c = evb.Consumer(str(r.config), "bu0", max_held=4)
    seen = []
    for ev in c:
        with ev:
            (f,) = ev.fragments
            assert (f.source_id, f.trigger_number, len(f)) == (0, ev.trigger_number, size)
            with memoryview(f) as m:
                assert m.readonly and m.tobytes() == pattern(ev.trigger_number, size)
                assert evb.crc32c(m) == f.payload_crc
            seen.append((ev.event_id, ev.trigger_number))
    assert seen == [(k, k + 1) for k in range(events)]
    assert c.finish().ok
    out, err = producer.communicate(timeout=60)
    assert producer.returncode == 0, out + err
    assert_verdict_ok(r.evm_report(), events)


def test_producer_without_an_evm_fails_in_its_constructor_naming_the_address():
    # nothing listens at the EVM's address: the constructor raises once the RU gives up
    # (run.connect_timeout_s), not a later unrelated call
    base = free_base_port()
    toml = (API.replace("[run]\n", "[run]\nconnect_timeout_s = 1\n")
            + f"[topology]\nrus = 1\nbus = 1\nbase_port = {base}\n")
    started = time.monotonic()
    with pytest.raises(evb.SetupError, match=re.escape(f"127.0.0.1:{base}")) as e:
        evb.Producer(toml, "ru0")
    assert time.monotonic() - started < 1 + 4, e.value
    assert "evm" in str(e.value)
    with pytest.raises(evb.SetupError, match=re.escape(f"127.0.0.1:{base}")):
        evb.Producer.many(toml + '[[ru]]\nid = "ru0"\nproducer_sources = [1, 2]\n', "ru0")


def test_bad_producer_input_gets_clear_errors(run, tmp_path):
    r = run(API + "[topology]\nrus = 1\nbus = 1\n", ["evm", "bu0"])
    with pytest.raises(evb.SetupError, match="no RU"):
        evb.Producer(str(r.config), "ru7")
    with pytest.raises(evb.SetupError):
        evb.Producer("[run]\nthis is not toml\n", "ru0")
    with pytest.raises(evb.SetupError):
        evb.Producer(str(tmp_path / "nowhere.toml"), "ru0")
    p = evb.Producer(r.config, "ru0")  # a pathlib.Path works too
    assert p.max_fragment == 4096
    # wrong sizes: refused, nothing submitted
    with pytest.raises(evb.SizeError, match="4097"):
        p.buffer(4097)
    b = p.buffer(100, block=False)
    assert (len(b), b.capacity) == (100, 100)
    with pytest.raises(evb.SizeError):
        b.set_len(101)
    b.set_len(10)
    # a view alive at submission: refused, the buffer still usable
    m = memoryview(b)
    m[:] = b"0123456789"
    with pytest.raises(evb.StateError, match="view"):
        p.submit(b, 7)
    m.release()
    assert p.submit(b, 7) == 0
    # submitted twice, or written after submission: errors, never a crash
    with pytest.raises(evb.StateError, match="submitted already"):
        p.submit(b, 8)
    with pytest.raises(BufferError):
        memoryview(b)
    with pytest.raises(evb.StateError):
        b.set_len(1)
    assert b.submitted
    # wrong types and ranges
    with pytest.raises(TypeError):
        p.submit(b"not a buffer", 8)
    with pytest.raises(TypeError):
        p.submit_copy("text is not bytes", 8)
    with pytest.raises(OverflowError):
        p.submit_copy(b"x", -1)
    with pytest.raises(OverflowError):
        p.submit_copy(b"x", 2**32)
    with pytest.raises(evb.SizeError):
        p.submit_copy(bytes(5000), 8)
    # read-only memory can't be a writable view of a buffer, and a buffer is not readable
    # as another type
    p.submit_copy(memoryview(b"next"), 8)
    # a trigger number going backwards: on_error = "stop" stops the run, naming it
    with pytest.raises(evb.Refused, match="trigger number 3 after 8") as e:
        p.submit_copy(b"late", 3)
    assert e.value.run_stopped is True
    assert isinstance(e.value, evb.Error)
    with pytest.raises(evb.RunOver):
        p.submit_copy(b"more", 9)
    with pytest.raises(evb.RunOver):
        p.buffer(10)
    ru = p.finish()
    assert not ru.ok and "out of order" in ru.reason
    # calls after finish
    with pytest.raises(evb.StateError, match="finished"):
        p.finish()
    with pytest.raises(evb.StateError, match="finished"):
        p.buffer(10)
    with pytest.raises(evb.StateError, match="finished"):
        p.submit_copy(b"x", 10)
    out, err = r.wait("evm")
    assert "trigger number 3 after 8" in out + err
    r.close()


def test_trigger_backwards_under_drop_builds_the_event_without_it(run):
    r = run(API.replace('kind = "api"', 'kind = "api"\non_error = "drop"')
            + "[topology]\nrus = 1\nbus = 1\n", ["evm", "bu0"])
    p = evb.Producer(str(r.config), "ru0")
    p.submit_copy(b"one", 10)
    with pytest.raises(evb.Refused) as e:
        p.submit_copy(b"two", 10)
    assert e.value.run_stopped is False
    p.submit_copy(bytearray(b"three"), 11)
    assert p.events_submitted == 3
    assert p.finish().ok
    report = r.evm_report()
    assert_verdict_ok(report, 3)
    assert report["run"]["bus"][0]["partial_events"] == 1


def test_full_pool_raises_full_without_blocking(run):
    # a consumer that takes nothing holds the BU back; the RU's small pool fills
    r = run(API + "[buffers]\nblock_size = 65536\nru_pool_mib = 1\n[builder]\ncredits = 2\n"
            '[sink]\nkind = "api"\n[topology]\nrus = 1\nbus = 1\n', ["evm"])
    c = evb.Consumer(str(r.config), "bu0", max_held=1)
    p = evb.Producer(str(r.config), "ru0")
    sent = 0
    with pytest.raises(evb.Full):
        while sent < 100_000:
            p.submit_copy(np.full(4096, sent % 256, dtype=np.uint8), sent + 1, block=False)
            sent += 1
    assert 0 < sent < 100_000
    with pytest.raises(evb.Full):
        p.buffer(4096, block=False)
    # consuming frees room again: the rest goes through, blocking as needed
    got = []

    import threading

    def consume():
        for ev in c:
            got.append(bytes(ev.fragments[0])[0])
            ev.release()

    t = threading.Thread(target=consume)
    t.start()
    for k in range(sent, sent + 200):
        p.submit_copy(np.full(4096, k % 256, dtype=np.uint8), k + 1)
    assert p.finish().ok
    t.join(60)
    assert got == [k % 256 for k in range(sent + 200)]
    assert c.finish().ok
    assert_verdict_ok(r.evm_report(), sent + 200)


def test_several_python_producers_on_threads_make_super_fragments(run):
    import threading
    events = 2000
    r = run(API + '[sink]\nkind = "file"\ndir = "out"\n[topology]\nbus = 2\n'
            '[[ru]]\nid = "ru0"\nproducer_sources = [841, 843]\n', ["evm", "bu0", "bu1"])
    with pytest.raises(evb.SetupError, match="start_many"):
        evb.Producer(str(r.config), "ru0")
    ps = evb.Producer.many(str(r.config), "ru0")
    assert [p.source_id for p in ps] == [841, 843]
    outcomes = [None, None]

    def board(i, p):
        for k in range(events):
            data = payload(k)[:1000]
            buf = p.buffer(len(data) + 1)
            view = np.frombuffer(buf, dtype=np.uint8)
            view[:-1] = data
            view[-1] = i
            del view
            p.submit(buf, k + 1)
        outcomes[i] = p.finish()

    threads = [threading.Thread(target=board, args=(i, p)) for i, p in enumerate(ps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o.ok for o in outcomes), [o.reason for o in outcomes]
    report = r.evm_report()
    assert_verdict_ok(report, events)
    assert all(b["super_fragment_errors"] == 0 for b in report["run"]["bus"])
    # each event: an 8 + 2 x 16 byte directory, then both boards' payloads
    want = sum(2 * (min(len(payload(k)), 1000) + 1) + 40 for k in range(events))
    assert sum(b["payload_bytes_built"] for b in report["run"]["bus"]) == want


def test_python_producer_frames_are_built_into_time_slices(run):
    """A run built by time fed by a Python producer of frames: every frame in exactly one
    slice core (the outside reader of docs/formats.md §8), the cores' bytes the payloads
    submitted; a fragment in such a run is a StateError."""
    import json
    import pathlib
    import sys

    slices, frame = 40, 500
    r = run('[run]\nid = "pyframes"\nduration_s = 0\n'
            '[source]\nkind = "api"\nmax_fragment = 4096\nread_ahead = 8\n'
            '[builder]\nby = "time"\nslice_ticks = 10000\noverlap_ticks = 1000\n'
            '[frames]\nticks = 500\n'
            '[sink]\nkind = "file"\ndir = "out"\nfile_max_events = 16\n'
            "[topology]\nrus = 1\nbus = 2\n", ["evm", "bu0", "bu1"])
    p = evb.Producer(str(r.config), "ru0")
    with pytest.raises(evb.StateError):
        p.submit_copy(b"x", 1)
    frames = slices * 10000 // frame
    total = 0
    for j in range(frames):
        data = payload(j)
        assert p.submit_frame(j * frame, (j + 1) * frame, data) == j
        total += len(data)
    ru = p.finish()
    assert ru.ok, ru.reason
    assert ru.report["stats"]["fragments_sent"] == slices
    assert ru.report["stats"]["stream_fragments_received"] == frames
    assert_verdict_ok(r.evm_report(), slices)
    checker = pathlib.Path(__file__).resolve().parents[2] / "cli/tests/outside/check_slices.py"
    out = subprocess.run([sys.executable, str(checker), str(r.dir / "out"), "--slice", "10000",
                          "--overlap", "1000", "--frame", str(frame)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["problems"] == 0, got
    assert got["records"] == slices
    assert got["sources"]["0"] == {"core_frames": frames, "core_bytes": total}, got


def test_decode_window_reads_a_record_s_frames_without_copying():
    """A window fragment's frames as a consumer reads them: `evb.decode_window` gives each
    frame's ticks, source and where its payload lies in the buffer (no copy); a damaged
    frame raises ValueError."""
    import struct
    # a window fragment by hand: window [0, 100) core end 100, two frames
    frames = []
    for begin, payload in ((0, b"abc"), (50, b"defgh")):
        head = struct.pack("<QQHH", begin, begin + 50, 7, 0)
        crc = evb.crc32c(head + payload)
        frames.append(head + struct.pack("<I", crc) + payload)
    body = b"".join(frames)
    directory = b"".join(struct.pack("<II", off, len(f)) for off, f in
                         ((0, frames[0]), (len(frames[0]), frames[1])))
    data = struct.pack("<QQQHHI", 0, 100, 100, 0, 0, 2) + directory + body
    w = evb.decode_window(data)
    assert (w["begin"], w["end"], w["core_end"], w["status"]) == (0, 100, 100, "complete")
    assert [f[:4] for f in w["frames"]] == [(0, 50, 7, 0), (50, 100, 7, 0)]
    view = memoryview(data)
    assert [bytes(view[o:o + n]) for *_, o, n in w["frames"]] == [b"abc", b"defgh"]
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        evb.decode_window(bytes(bad))
