"""The stall signal (`trl_nca.core.stall`) on its own: its rule on made-up step means and its state round trip. Its
recording by the trainer, its checkpoints and a real stalled run: tests/trainers/test_stall.py."""

import json

import pytest

from trl_nca.core.stall import STALL_GAP_LEFT, STALL_VIEW_SHARE, STALL_WINDOW, StallMonitor


def _feed(monitor, opd, view):
    return [monitor.update(o, v) for o, v in zip(opd, view)]


def test_the_rule_flags_a_run_that_stops_short_and_clears_one_that_internalises():
    steps = 6 * STALL_WINDOW
    # internalises: opd_loss falls from 9 to near 0 while the anchor keeps view_kl at a hundredth of it
    healthy = [9.0 * 0.8**s for s in range(steps)]
    logs = _feed(StallMonitor(), healthy, [o / 100 for o in healthy])
    flags = [log["nca/stall"] for log in logs]
    assert flags[: 2 * STALL_WINDOW - 1] == [0.0] * (2 * STALL_WINDOW - 1)  # not before two windows are done
    assert flags[2 * STALL_WINDOW] == 1.0 and flags[-1] == 0.0  # held views early, then arrived
    assert logs[-1]["nca/gap_left"] < STALL_GAP_LEFT
    # stops short: a fifth of the initial gap left, the two views held together
    stalled = [9.0] * STALL_WINDOW + [1.8] * (steps - STALL_WINDOW)
    monitor = StallMonitor()
    last = _feed(monitor, stalled, [o / 100 for o in stalled])[-1]
    assert last == {"nca/gap_left": pytest.approx(0.2), "nca/view_share": pytest.approx(0.01), "nca/stall": 1.0}
    assert monitor.stalled and "Training ended stalled: opd_loss over the last 10 steps is 20.0%" in monitor.message()
    # the same gap with views apart (plain OPD's picture: view_kl of the size of opd_loss) is no stall of the anchor
    apart = StallMonitor()
    _feed(apart, stalled, [o * 2 * STALL_VIEW_SHARE for o in stalled])
    assert not apart.stalled


def test_state_round_trip_continues_the_same_signal():
    opd = [9.0 - 0.1 * s for s in range(30)]
    whole, first = StallMonitor(), StallMonitor()
    expected = _feed(whole, opd, [0.01] * 30)
    _feed(first, opd[:15], [0.01] * 15)
    resumed = StallMonitor()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert _feed(resumed, opd[15:], [0.01] * 15) == expected[15:]
