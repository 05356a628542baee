"""A Python consumer taking a BU's built events in real multi-process runs (EVM and RUs as
`evb node` processes): every event once with exact counts and checksums, payloads exported
in place (memoryview, numpy) and released back to the BU's pool."""

import gc
import json
import re
import time

import numpy as np
import pytest

import evb
from conftest import assert_verdict_ok, free_base_port

GEN = '[run]\nid = "cons"\nevents = {events}\nduration_s = 0\n[fragments]\nsize = {size}\n'


def test_python_consumer_takes_every_event(run):
    events, size = 2000, 2048
    r = run(GEN.format(events=events, size=size) + '[builder]\ncredits = 4\n'
            '[sink]\nkind = "api"\n[topology]\nrus = 2\nbus = 1\n', ["evm", "ru0", "ru1"])
    c = evb.Consumer(str(r.config), "bu0", max_held=2)
    ids, nbytes, in_place = [], 0, 0
    for ev in c:
        assert len(ev) == ev.fragment_count == 2
        assert not (ev.is_partial or ev.is_corrupt or ev.trigger_mismatch)
        frags = ev.fragments
        assert [f.source_id for f in frags] == [0, 1]
        for f in frags:
            assert f.trigger_number == ev.trigger_number and len(f) == size
            a = np.frombuffer(f, dtype=np.uint8)
            b = np.frombuffer(f, dtype=np.uint8)
            assert not a.flags.writeable
            assert a.ctypes.data == b.ctypes.data  # the same memory, twice
            assert evb.crc32c(a) == f.payload_crc
            chunks = [np.frombuffer(ch, dtype=np.uint8) for ch in f.chunks()]
            assert b"".join(ch.tobytes() for ch in chunks) == a.tobytes() == f.tobytes()
            if f.contiguous:
                # in place in the BU's pool: no copy
                in_place += 1
                assert len(chunks) == 1 and chunks[0].ctypes.data == a.ctypes.data
                del chunks
            else:
                # straddling two blocks: the chunks are in place, the whole is one copy
                assert len(chunks) == 2
            # the event cannot be released while views of it in place are alive
            with pytest.raises(evb.StateError, match="view"):
                ev.release()
            del a, b
            chunks = None
        nbytes += ev.bytes
        ids.append(ev.event_id)
        ev.release()
        assert ev.released
        ev.release()  # a second release does nothing
        with pytest.raises(BufferError, match="released"):
            memoryview(frags[0])
        assert frags[0].payload_crc  # the header's fields stay readable
    assert sorted(ids) == list(range(events)) and len(ids) == events
    assert nbytes == events * 2 * size
    assert in_place > events  # most fragments are one slice
    assert c.events_taken == events
    bu = c.finish()
    assert bu.ok, bu.reason
    assert bu.report["sink"]["report"]["delivered"] == events
    with pytest.raises(evb.StateError, match="finished"):
        c.next()
    with pytest.raises(evb.StateError, match="finished"):
        c.finish()
    assert_verdict_ok(r.evm_report(), events)


def test_events_kept_released_by_with_and_by_gc(run):
    events = 300
    r = run(GEN.format(events=events, size=512) + '[sink]\nkind = "api"\n'
            "[topology]\nrus = 1\nbus = 1\n", ["evm", "ru0"])
    c = evb.Consumer(str(r.config), "bu0", max_held=3)
    with pytest.raises(evb.Timeout):
        # nothing held yet may come at once; a zero timeout answers at once either way
        while True:
            ev = c.next(timeout=0)
            assert ev is not None
            ev.release()
    got = 0
    kept = None
    while (ev := c.next(timeout=30)) is not None:
        got += 1
        if kept is None:
            # a view outliving its `with` block: the event is released when it goes
            with ev:
                kept = np.frombuffer(ev.fragments[0], dtype=np.uint8)
            assert not ev.released
            first = kept.tobytes()
            del kept
            assert ev.released
            kept = first
        elif got % 2:
            with ev:
                pass
            assert ev.released
        else:
            del ev  # released when garbage collected
            gc.collect()
    assert got + 0 <= events
    assert c.finish().ok
    assert_verdict_ok(r.evm_report(), events)


def test_fragments_larger_than_a_block_come_in_chunks(run):
    events, size = 40, 100_000
    r = run(GEN.format(events=events, size=size) + '[buffers]\nblock_size = 65536\n'
            '[sink]\nkind = "api"\n[topology]\nrus = 1\nbus = 1\n', ["evm", "ru0"])
    c = evb.Consumer(str(r.config), "bu0")
    n = 0
    for ev in c:
        with ev:
            (f,) = ev.fragments
            chunks = f.chunks()
            assert not f.contiguous and len(chunks) > 1
            views = [memoryview(ch) for ch in chunks]
            joined = b"".join(v.tobytes() for v in views)
            assert len(joined) == size and evb.crc32c(joined) == f.payload_crc
            with memoryview(f) as whole:  # one copy, made once
                assert whole.tobytes() == joined
            del views
        n += 1
    assert n == events
    assert c.finish().ok
    assert_verdict_ok(r.evm_report(), events)


def test_python_consumer_example_as_its_own_process(run):
    events = 1000
    r = run(GEN.format(events=events, size=1024) + "[topology]\nrus = 2\nbus = 2\n"
            '[[bu]]\nid = "bu0"\nsink = "api"\n[[bu]]\nid = "bu1"\n', ["evm", "ru0", "ru1", "bu1"])
    consumer = r.python("consumer.py", r.config, "bu0")
    out, err = consumer.communicate(timeout=120)
    if consumer.returncode != 0:
        for node in list(r.kids):
            print(node, r.wait(node))
    assert consumer.returncode == 0, out + err
    mine = json.loads(out.strip().splitlines()[-1])
    report = r.evm_report()
    assert_verdict_ok(report, events)
    bus = report["run"]["bus"]
    assert sum(b["events_built"] for b in bus) == events
    assert mine["bad_crc"] == 0 and mine["ok"]
    assert mine["bytes"] == mine["events"] * 2 * 1024
    # bu0's events, every one of them taken by the consumer
    built = {b.get("id", b.get("node")): b["events_built"] for b in bus}
    assert mine["events"] == built.get("bu0", mine["events"]) and 0 < mine["events"] < events


def test_consumer_setup_errors(run):
    r = run(GEN.format(events=10, size=64) + "[topology]\nrus = 1\nbus = 1\n", [])
    with pytest.raises(evb.SetupError, match="api"):
        evb.Consumer(str(r.config), "bu0")
    with pytest.raises(evb.SetupError, match="no BU"):
        evb.Consumer(str(r.config), "bu9")


def test_consumer_without_an_evm_fails_in_its_constructor_naming_the_address():
    base = free_base_port()
    toml = (GEN.format(events=10, size=64).replace("[run]\n", "[run]\nconnect_timeout_s = 1\n")
            + f'[sink]\nkind = "api"\n[topology]\nrus = 1\nbus = 1\nbase_port = {base}\n')
    started = time.monotonic()
    with pytest.raises(evb.SetupError, match=re.escape(f"127.0.0.1:{base}")) as e:
        evb.Consumer(toml, "bu0")
    assert time.monotonic() - started < 1 + 4, e.value
