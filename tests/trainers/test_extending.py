"""docs/extending.md's two examples, a divergence and a schedule, registered from outside the package (the page's
code run as a module of its own): the divergence against a float64 full-logit reference in value and gradient, and
one trained step with each on a tiny model."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_trainer import make_args

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.losses import NCA_DIVERGENCES, DivergenceSpec, LMHead, divergence_names, token_divergences
from trl_nca.core.schedule import SCHEDULES
from trl_nca.testing import FLOAT64, STORED32, make_tiny_model, prompt_dataset


PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


@pytest.fixture
def extension():
    """The page's Python blocks of registration from outside run in order as the module `my_extension`; its
    registrations are undone after (a package that ships the same names, as the page's second half adds them, has
    them set aside meanwhile)."""
    module = types.ModuleType("my_extension")
    sys.modules[module.__name__] = module
    shipped = {"reverse_kl": NCA_DIVERGENCES.pop("reverse_kl", None), "step": SCHEDULES.pop("step", None)}
    try:
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
            exec(compile(block, str(PAGE), "exec"), module.__dict__)
        yield module
    finally:
        NCA_DIVERGENCES.pop("reverse_kl", None)
        SCHEDULES.pop("step", None)
        if shipped["reverse_kl"] is not None:
            NCA_DIVERGENCES["reverse_kl"] = shipped["reverse_kl"]
        if shipped["step"] is not None:
            SCHEDULES["step"] = shipped["step"]
        del sys.modules[module.__name__]


def test_the_pages_divergence_matches_a_full_logit_reference(extension):
    """KL(q_c || sg[q_x]) from the tiles (3 token chunks x 5 vocabulary chunks) equals the float64 full-logit value,
    and its gradient reaches the context view and the head only."""
    g = torch.Generator().manual_seed(0)
    h_x, h_c, h_t = (torch.randn(5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(31, 8, generator=g, dtype=torch.float64, requires_grad=True)
    spec = DivergenceSpec(nca_divergence="reverse_kl")
    out = token_divergences(
        h_x, h_t.detach(), LMHead(w), LMHead(w.detach()), spec, h_c=h_c, terms=("nca",), vocab_chunk=7, token_chunk=2
    )["nca"]
    lpx, lpc = F.log_softmax(h_x @ w.T, -1), F.log_softmax(h_c @ w.T, -1)
    ref = F.kl_div(lpx.detach(), lpc, log_target=True, reduction="none").sum(-1)  # sum_v q_c (log q_c - log q_x)
    FLOAT64.close(out, ref)
    grads = torch.autograd.grad(out.sum(), (h_x, h_c, w), allow_unused=True)
    ref_grads = torch.autograd.grad(ref.sum(), (h_c, w))
    assert grads[0] is None or not grads[0].abs().sum()  # the anchor is held constant
    for got, want in zip(grads[1:], ref_grads):
        FLOAT64.close(got, want)


def test_a_step_trains_with_the_pages_divergence(extension, tok, tmp_path):
    """The same first step under `forward_kl` and the page's `reverse_kl`: the same samples and OPD term, another NCA
    term, and the loss is opd_loss + nca_beta * nca_loss with it."""
    steps = {}
    for divergence in ("forward_kl", "reverse_kl"):
        args = make_args(tmp_path / divergence, max_steps=1, nca_beta=0.5, nca_divergence=divergence)
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(2),
            processing_class=tok,
        )
        trainer.train()
        (steps[divergence],) = [h for h in trainer.state.log_history if "nca_loss" in h]
    forward, reverse = steps["forward_kl"], steps["reverse_kl"]
    assert reverse["opd_loss"] == forward["opd_loss"] and reverse["nca_loss"] != forward["nca_loss"]
    assert reverse["nca_loss"] > 0 and reverse["loss"] == STORED32.approx(
        reverse["opd_loss"] + 0.5 * reverse["nca_loss"]
    )
    assert "reverse_kl" in divergence_names()  # a choice of the config from the registration on
    with pytest.raises(ValueError, match=re.escape(f"nca_divergence must be one of {divergence_names()},")):
        make_args(tmp_path, nca_divergence="reverse-kl")


def test_a_run_follows_the_pages_schedule(extension, tok, tmp_path):
    """The step anchor with nca_warmup_steps=2: weights 0, 0, then nca_beta; the model card says so; the config reads
    its field (no other schedule field is named as unread)."""
    args = make_args(tmp_path, max_steps=3, nca_beta=0.5, nca_beta_schedule="step", nca_warmup_steps=2)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(6), processing_class=tok
    )
    assert type(trainer.nca.schedule) is extension.StepSchedule
    trainer.train()
    assert [h["nca_beta"] for h in trainer.state.log_history if "loss" in h and "nca_beta" in h] == [0.0, 0.0, 0.5]
    trainer.create_model_card(model_name="student")
    assert (
        "The anchor was off for 2 optimizer steps, then at `nca_beta=0.5`."
        in (tmp_path / "out" / "README.md").read_text()
    )
    from trl_nca.core.schedule import unread_settings

    assert unread_settings(args) == []
    assert isinstance(args, NCAConfig)


# The page's blocks that add to the package: ```python title="PATH (WHERE)"
ADDED = re.compile(r'```python title="(?P<path>[^"]+?) \((?P<where>[^)]+)\)"\n(?P<body>.*?)```', re.S)
# The tests the page's additions and rewrites concern (the copy's own copy of this test excluded)
FOLLOWED_TESTS = [
    "tests/core/test_losses.py",
    "tests/core/test_schedule_rules.py",
    "tests/eval/test_columns.py",
    "tests/eval/test_eval_metrics.py",
    "tests/cli/test_help.py::test_the_help_spec_is_what_the_parsers_render",
    "tests/project/test_docs.py",
    "tests/trainers/test_extending.py",
]


def _add(text: str, where: str, body: str) -> str:
    """`body` added to a module's `text` where the page says."""
    if where == "at the end":
        return text.rstrip("\n") + "\n\n\n" + body
    if where == "at the end of COLUMNS":
        end = text.index("\n)\n\nBY_KEY")
        return (
            text[:end]
            + "\n"
            + "".join(f"    {line}" if line.strip() else line for line in body.splitlines(True))
            + text[end + 1 :]
        )
    raise AssertionError(f"docs/extending.md adds a block {where!r}, which this test does not know how to follow")


@pytest.mark.slow  # a copy of the repository, its generated files rewritten and its tests run, in processes of their own
def test_the_page_followed_in_a_copy_of_the_repository_leaves_its_tests_green(tmp_path):
    """docs/extending.md followed exactly: the divergence, the schedule and the paired metric added to the package
    with their tests, then the generated files rewritten by the commands the page gives; the tests that check all
    of it pass in the copy."""
    root, copy = PAGE.parents[1], tmp_path / "repo"
    for name in ("trl_nca", "tests", "docs", "scripts", "examples"):
        shutil.copytree(root / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "mkdocs.yml", "README.md"):
        shutil.copy(root / name, copy / name)
    page = PAGE.read_text()
    added = list(ADDED.finditer(page))
    assert {m["path"] for m in added} >= {
        "trl_nca/core/losses.py",
        "trl_nca/core/schedule.py",
        "trl_nca/eval/columns.py",
    }
    for block in added:
        target = copy / block["path"]
        target.write_text(_add(target.read_text(), block["where"], block["body"]))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    (commands,) = re.findall(r"```bash\n(.*?)```", page, re.S)
    for line in commands.splitlines():
        command = shlex.split(line.split("#")[0])
        result = subprocess.run([sys.executable, *command[1:]], cwd=copy, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", "not in_a_copy"]
        + FOLLOWED_TESTS,
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "discordant" in (copy / "docs" / "evaluation.md").read_text()
    assert "reverse_kl" in (copy / "trl_nca" / "resources" / "cli_help.json").read_text()
