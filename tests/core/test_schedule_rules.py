"""The anchor-weight schedules (`trl_nca.core.schedule`) on their own: the formulas, the registry the config's choices
and docs come from, the checks of settings that cannot act, the model card's sentence and the state round trip.
The trainer's use of them step by step: tests/trainers/test_schedule.py."""

import json
import math
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from trl_nca.core.schedule import (
    ADAPTIVE_TARGET_MAX,
    SCHEDULES,
    AdaptiveSchedule,
    ConstantSchedule,
    GatedSchedule,
    WarmupSchedule,
    register_schedule,
    schedule_from_config,
    schedule_names,
    schedule_reads,
)


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on a few terms with exact fractions
# (error near 1e-16).


def test_constant_and_warmup_values():
    constant = ConstantSchedule(beta=0.5)
    assert [constant.value] + [constant.update() for _ in range(3)] == [0.5] * 4
    warmup = WarmupSchedule(beta=0.6, warmup_steps=3)
    values = [warmup.value] + [warmup.update() for _ in range(4)]
    assert values == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.6])


def test_adaptive_update_follows_the_formula_and_the_bounds():
    s = AdaptiveSchedule(beta=0.5, adaptive_init=0.1, adaptive_min=0.01, adaptive_target=1.0, adaptive_horizon=2.0)
    assert s.value == 0.1
    # ratio 1.1 -> e = 0.1 -> x (1 + 0.1 / 2)
    assert s.update({"opd_loss": 1.0, "view_kl": 1.1}) == pytest.approx(0.105)
    # ratio far above 1 -> e clipped at 0.2 -> x 1.1
    assert s.update({"opd_loss": 1e-4, "view_kl": 0.3}) == pytest.approx(0.1155)
    # ratio 0 -> e = -0.2 -> x 0.9
    assert s.update({"opd_loss": 2.0, "view_kl": 0.0}) == pytest.approx(0.10395)
    for _ in range(200):
        s.update({"opd_loss": 1.0, "view_kl": 0.0})
    assert s.value == 0.01  # the lower bound
    for _ in range(200):
        s.update({"opd_loss": 0.0, "view_kl": 1.0})
    assert s.value == 0.5  # the upper bound is nca_beta
    s.update({"opd_loss": float("nan"), "view_kl": 1.0})
    assert s.value == 0.5 and s.steps_done == 404
    target = AdaptiveSchedule(beta=1.0, adaptive_init=0.5, adaptive_target=2.0)
    assert target.update({"opd_loss": 1.0, "view_kl": 1.5}) == pytest.approx(0.5 * (1 - 0.2))  # 1.5 / 2 - 1 < -0.2


def test_adaptive_anchor_can_start_off_until_the_views_drift():
    s = AdaptiveSchedule(beta=0.5, adaptive_init=0.0, adaptive_min=0.05)
    assert s.value == 0.0
    assert s.update({"opd_loss": 9.0, "view_kl": 9.0}) == 0.0  # ratio 1: no drift yet
    assert s.update({"opd_loss": 5.0, "view_kl": 2.0}) == 0.0
    assert s.update({"opd_loss": 0.1, "view_kl": 0.3}) == 0.05  # the context view drifted: on, at the minimum
    assert s.update({"opd_loss": 0.1, "view_kl": 0.3}) == pytest.approx(0.06)
    assert s.update({"opd_loss": 1.0, "view_kl": 0.0}) == pytest.approx(0.05)  # once on, never below the minimum
    with pytest.raises(ValueError, match="either 0"):
        AdaptiveSchedule(beta=0.5, adaptive_init=0.01, adaptive_min=0.05)


def test_state_round_trip_and_errors():
    s = AdaptiveSchedule(beta=0.5)
    for _ in range(3):
        s.update({"opd_loss": 0.1, "view_kl": 1.0})
    restored = AdaptiveSchedule(beta=0.5)
    restored.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert restored.value == s.value and restored.steps_done == 3
    with pytest.raises(ValueError, match="same nca_beta_schedule"):
        WarmupSchedule(beta=0.5, warmup_steps=2).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="nca_warmup_steps >= 1"):
        WarmupSchedule(beta=0.5)
    with pytest.raises(ValueError, match="upper bound"):
        AdaptiveSchedule(beta=0.0)
    with pytest.raises(ValueError, match="nca_adaptive_min <= nca_beta"):
        AdaptiveSchedule(beta=0.5, adaptive_init=0.9)
    with pytest.raises(ValueError, match="opd_loss and view_kl"):
        AdaptiveSchedule(beta=0.5).update({"opd_loss": 1.0})


def test_non_finite_adaptive_settings_are_refused():
    # an infinite target would keep a gated anchor off for good, an infinite horizon would freeze the weight
    for field in ("adaptive_target", "adaptive_horizon"):
        for value in (math.inf, math.nan):
            with pytest.raises(ValueError, match="must be finite and > 0"):
                AdaptiveSchedule(beta=0.5, **{field: value})


def test_the_registry_names_its_schedules_and_what_each_reads():
    """What the config reads comes from the registry, whatever it holds: every registered schedule is a choice of
    `nca_beta_schedule`, and each field a schedule declares is read by exactly the schedules declaring it."""
    assert schedule_names() == tuple(SCHEDULES) and {"constant", "warmup", "adaptive", "gated"} <= set(SCHEDULES)
    reads = schedule_reads()
    assert reads["nca_beta_schedule"] == schedule_names()
    declared = {name for cls in SCHEDULES.values() for name in cls.reads}
    assert set(reads) == {"nca_beta_schedule", *declared}
    for name in declared:
        assert reads[name] == tuple(kind for kind, cls in SCHEDULES.items() if name in cls.reads)
    assert WarmupSchedule.reads == ("nca_warmup_steps",)  # the fields of the shipped schedules' formulas
    assert set(AdaptiveSchedule.reads) == {f"nca_adaptive_{p}" for p in ("init", "min", "target", "horizon")}
    assert set(GatedSchedule.reads) == set(AdaptiveSchedule.reads) - {"nca_adaptive_init"}  # it starts at 0
    with pytest.raises(ValueError, match="'warmup' is already registered"):
        register_schedule(WarmupSchedule)
    with pytest.raises(ValueError, match="declares no field"):

        class Reader(ConstantSchedule):
            kind = "reader"
            reads = ("nca_warmup_steps",)

        register_schedule(Reader)
    assert "reader" not in SCHEDULES


def _config(**fields):
    """The schedule fields of a config at their defaults (a plain namespace: the schedules read only these)."""
    defaults = dict(
        nca_beta=0.5,
        nca_beta_schedule="adaptive",
        nca_warmup_steps=0,
        nca_adaptive_init=0.0,
        nca_adaptive_min=0.05,
        nca_adaptive_target=1.1,
        nca_adaptive_horizon=1.0,
    )
    return SimpleNamespace(**{**defaults, **fields})


def test_a_config_builds_its_schedule_with_the_fields_it_reads():
    warmup = schedule_from_config(_config(nca_beta_schedule="warmup", nca_warmup_steps=4.0))
    assert type(warmup) is WarmupSchedule and warmup.warmup_steps == 4 and isinstance(warmup.warmup_steps, int)
    gated = schedule_from_config(_config(nca_beta=2, nca_adaptive_min=1))
    assert type(gated) is AdaptiveSchedule and gated.adaptive_min == 1.0 and isinstance(gated.adaptive_min, float)
    assert type(schedule_from_config(_config(nca_beta=0))) is ConstantSchedule  # plain OPD: no anchor to schedule
    with pytest.raises(ValueError, match=re.escape(f"nca_beta_schedule must be one of {schedule_names()}")):
        schedule_from_config(_config(nca_beta_schedule="cosine"))


def test_a_warmup_longer_than_the_run_is_named_and_the_card_says_what_happened():
    """The anchor of step s + 1 weighs s / warmup_steps: a warmup of W steps reaches nca_beta at step W + 1, so a run of
    at most W steps never does; with max_steps=1 the only step weighs it 0."""
    schedule = WarmupSchedule(beta=0.5, warmup_steps=1000)
    (line,) = schedule.cannot_act(max_steps=1)
    assert line.startswith("nca_warmup_steps=1000 is not shorter than the run (max_steps=1)") and "at 0." in line
    assert "Set nca_warmup_steps below max_steps" in line
    assert WarmupSchedule(beta=0.5, warmup_steps=3).cannot_act(max_steps=4) == []
    assert "at 0.375" in WarmupSchedule(beta=0.5, warmup_steps=4).cannot_act(max_steps=4)[0]
    assert schedule.cannot_act(max_steps=-1) == []  # the length is set by the epochs: not known here
    schedule.update()
    card = schedule.describe()
    assert "warmed up linearly" not in card and "over 1000 optimizer steps" in card, card
    assert "the run ended after 1 optimizer step, the last weighing the anchor at 0 (it never acted)" in card
    short = WarmupSchedule(beta=0.6, warmup_steps=3)
    for _ in range(3):
        short.update()
    assert "the last weighing the anchor at 0.4." in short.describe()
    short.update()  # step 4 ran at the full weight
    assert short.describe().startswith("The anchor warmed up linearly from 0 to `nca_beta=0.6` over 3 optimizer steps")


def test_a_gate_that_never_opened_is_described_as_plain_opd():
    gated = AdaptiveSchedule(beta=0.5)
    assert "then started at 0.05" in gated.describe()  # before training: what the gate does
    for _ in range(3):
        gated.update({"opd_loss": 1.0, "view_kl": 1.0})
    assert "they never did in the 3 optimizer steps run, so the anchor never acted" in gated.describe()
    gated.update({"opd_loss": 1.0, "view_kl": 2.0})
    assert "then started at 0.05" in gated.describe()


def test_a_gate_target_no_step_can_reach_is_refused():
    """Float32 step means: view_kl <= 3.4e38 and a positive opd_loss >= 1.4e-45, so a target above their ratio keeps
    the gate shut at every step whose opd_loss is not exactly 0."""
    assert ADAPTIVE_TARGET_MAX == pytest.approx(2.428e83, rel=1e-3)
    for init in (0.0, 0.1):
        with pytest.raises(ValueError, match=r"nca_adaptive_target=1e\+300 can never be reached") as error:
            AdaptiveSchedule(beta=0.5, adaptive_init=init, adaptive_target=1e300)
        assert "\n" not in str(error.value) and "nca_beta=0 for plain OPD" in str(error.value)
    AdaptiveSchedule(beta=0.5, adaptive_target=1e80)  # reachable in principle: accepted


def test_unread_schedule_fields_are_named_one_line_each():
    from trl_nca.core.schedule import unread_settings

    @dataclass
    class Fields:
        nca_beta: float = 0.5
        nca_beta_schedule: str = "adaptive"
        nca_warmup_steps: int = 0
        nca_adaptive_init: float = 0.0
        nca_adaptive_min: float = 0.05
        nca_adaptive_target: float = 1.1
        nca_adaptive_horizon: float = 1.0

    def readers(field):  # the schedules of the registry that read `field`, as the line names them
        return " or ".join(f"nca_beta_schedule={kind!r}" for kind in schedule_reads()[field])

    assert unread_settings(Fields()) == []
    assert unread_settings(Fields(nca_beta_schedule="constant")) == []  # only fields set away from their defaults
    assert unread_settings(Fields(nca_beta_schedule="constant", nca_adaptive_target=2.0)) == [
        "nca_adaptive_target=2.0 is set but nca_beta_schedule='constant' does not read it. Remove it, or set "
        f"{readers('nca_adaptive_target')} to use it."
    ]
    assert unread_settings(Fields(nca_warmup_steps=5)) == [
        "nca_warmup_steps=5 is set but nca_beta_schedule='adaptive' does not read it. Remove it, or set "
        f"{readers('nca_warmup_steps')} to use it."
    ]
    (line,) = unread_settings(Fields(nca_beta=0.0, nca_adaptive_min=0.1))
    assert "nca_beta=0 (plain OPD) schedules no anchor. Remove it, or set nca_beta > 0 and" in line
    # several methods: a field some method's schedule reads is not named
    assert unread_settings(Fields(nca_beta_schedule="constant", nca_adaptive_init=0.01), ("constant", "adaptive")) == []


def test_the_gated_schedule_is_the_adaptive_one_started_off():
    """`gated` (the default's name in the registry) weighs every step as `adaptive` with `nca_adaptive_init=0`, its
    settings before it had a name: the default's numbers are those of docs/results.md section 10's `gated`."""
    import random

    from trl_nca.core.schedule import AdaptiveSchedule, GatedSchedule

    rng = random.Random(0)
    gated, adaptive = GatedSchedule(beta=0.5), AdaptiveSchedule(beta=0.5, adaptive_init=0.0)
    for step in range(1, 200):
        measured = {"opd_loss": rng.uniform(0.01, 1.0), "view_kl": rng.uniform(0.0, 1.5)}
        assert gated.update(measured, step) == adaptive.update(measured, step)
    assert (
        gated.value > 0 and gated.kind == "gated" and gated.state_dict()["current"] == adaptive.state_dict()["current"]
    )
