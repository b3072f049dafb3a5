"""The deprecation policy (docs/design.md, "Deprecation policy"): every renamed or moved public name still works
under its old name, with a FutureWarning naming the new one, and gives what the new name gives."""

import importlib
import re
import sys

import pytest
import torch

from trl_nca import NCATrainer
from trl_nca.core.deprecation import REMOVED_IN
from trl_nca.core.losses import DivergenceSpec, LMHead, token_divergences
from trl_nca.testing import make_tiny_model, prompt_dataset


def _import_afresh(name):
    sys.modules.pop(name, None)
    with pytest.warns(FutureWarning, match=rf"{re.escape(name)} is deprecated.*{REMOVED_IN}"):
        return importlib.import_module(name)


@pytest.mark.parametrize(
    "old,names",
    [
        ("trl_nca.losses", {"token_divergences": "trl_nca.core.losses", "DivergenceSpec": "trl_nca.core.losses"}),
        (
            "trl_nca.objective",
            {
                "NCAObjective": "trl_nca.trainers.objective",
                "batch_stats": "trl_nca.trainers.stats",
                "load_schedule": "trl_nca.trainers.checkpoints",
                "resolve_resume": "trl_nca.trainers.checkpoints",
                "NCA_PAPER": "trl_nca.trainers.setup",
            },
        ),
        ("trl_nca.trainers.trainer", {"NCATrainer": "trl_nca.trainers.nca_trainer"}),
        ("trl_nca.trainers.distillation", {"NCADistillationTrainer": "trl_nca.trainers.nca_distillation_trainer"}),
        (
            "trl_nca.trainers.config",
            {
                "NCAConfig": "trl_nca.trainers.nca_config",
                "NCAFields": "trl_nca.trainers.nca_config",
                "NCADistillationConfig": "trl_nca.trainers.nca_distillation_config",
            },
        ),
        (
            "trl_nca.config",
            {"NCAConfig": "trl_nca.trainers.nca_config", "resume_checkpoint": "trl_nca.trainers.script_options"},
        ),
    ],
)
def test_moved_modules_still_import_with_a_warning(old, names):
    module = _import_afresh(old)
    for name, home in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018


@pytest.mark.parametrize(
    "old,name,home",
    [
        ("trl_nca.envs.experience", "build_parser", "trl_nca.cli.experience_command"),
        ("trl_nca.cli.eval", "json_object_arg", "trl_nca.cli.options"),
    ],
)
def test_moved_names_still_import_with_a_warning(old, name, home):
    module = importlib.import_module(old)
    with pytest.warns(FutureWarning, match=rf"{re.escape(old)}\.{name} is deprecated: use {re.escape(home)}\.{name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018


def _states(seed, tokens=5, width=8):
    return torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_token_divergences_want_is_terms():
    head = LMHead(_states(0, 11))
    args = (_states(1), _states(2), head, head, DivergenceSpec())
    new = token_divergences(*args, h_c=_states(3), terms=("opd", "view_kl"))
    with pytest.warns(FutureWarning, match=r"token_divergences\(want=\.\.\.\) is deprecated: use terms="):
        old = token_divergences(*args, h_c=_states(3), want=("opd", "view_kl"))
    assert old.keys() == new.keys() == {"opd", "view_kl"}
    for key in new:
        assert torch.equal(old[key], new[key]), key
    with pytest.raises(TypeError, match="both want= .* and terms="):
        token_divergences(*args, terms=("opd",), want=("opd",))


@pytest.fixture(scope="module")
def trainer(tok, tmp_path_factory):
    from trl_nca import NCAConfig
    from trl_nca.testing import SHORT_RUN, run_args

    args = run_args(NCAConfig, tmp_path_factory.mktemp("deprecations") / "out", SHORT_RUN, nca_beta=0.25)
    return NCATrainer(model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(4), processing_class=tok)


def test_objective_measure_is_measure_gradients(trainer):
    trainer.args.nca_monitor = False
    objective = trainer.nca
    objective.active = False  # the NCA term off: only a measurement needs the context view
    try:
        with pytest.warns(FutureWarning, match=r"need_context\(measure=\.\.\.\) is deprecated: use measure_gradients="):
            assert objective.need_context(measure=True) is objective.need_context(measure_gradients=True) is True
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
        batch = trainer._with_completions(batch, on_policy=True)
        student, teacher = trainer.model, trainer._teacher()
        with pytest.warns(FutureWarning, match=r"token_divergences\(measure=\.\.\.\) is deprecated"):
            old = objective.token_divergences(student, teacher, batch, True, measure=True)
        new = objective.token_divergences(student, teacher, batch, True, measure_gradients=True)
    finally:
        objective.active = True
    assert old.keys() == new.keys() and "nca" in new
    for key in new:
        assert torch.equal(old[key], new[key]), key


def test_trainer_schedule_and_divergence_spec_names(trainer):
    with pytest.warns(FutureWarning, match=r"NCATrainer\.nca_schedule is deprecated: use trainer\.nca\.schedule"):
        assert trainer.nca_schedule is trainer.nca.schedule
    with pytest.warns(FutureWarning, match=r"NCATrainer\.divergence_spec is deprecated: use trainer\.nca\.spec"):
        assert trainer.divergence_spec is trainer.nca.spec
