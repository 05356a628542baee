"""An outside trigger program in Python (`evb.Trigger`): the EVM on a thread of this process,
the RUs and the BU as `evb node` processes; each decision becomes the run's next record."""

import pytest

import evb

WINDOWS = (
    '[run]\nid = "pytrigger"\nevents = 30\nduration_s = 0\n'
    '[builder]\nby = "window"\n[frames]\nticks = 100\nsize = 64\n'
    "[windows]\noutside = true\nlongest_ticks = 1000\ntick_hz = 1000000\n"
    "buffer_ms = 3600000\nwait_ms = 1000\n[topology]\nrus = 2\nbus = 1\n"
)


def test_python_trigger_decides_every_record_and_refuses_bad_windows(run):
    r = run(WINDOWS, ["ru0", "ru1", "bu0"])
    t = evb.Trigger(str(r.config))
    with pytest.raises(evb.Refused, match="end after it begins"):
        t.decide(10, 10)
    with pytest.raises(evb.Refused, match="names source 7"):
        t.decide(0, 10, [1, 7])
    for k in range(30):
        # every third over source 1 only: source 0's fragment EMPTY
        assert t.decide(k * 1000, k * 1000 + 500, [1] if k % 3 == 0 else []) == k
    assert t.decided == 30
    out = t.finish()
    assert out.ok, out.reason
    run_report = out.report["run"]
    assert run_report["evm"]["triggered"] == 30
    bu = run_report["bus"][0]
    assert bu["empty_components"] == 10, bu
    assert bu["partial_events"] == 0, bu
    with pytest.raises(evb.StateError):
        t.decide(0, 10)
    for node in ("ru0", "ru1", "bu0"):
        r.wait(node)
