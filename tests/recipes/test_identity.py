"""What identifies a run's numbers (`trl_nca.recipes.identity`): a library's new default field or its version is no
difference, a field that changes the numbers is one; in every check that compares settings (documented outcomes and
ranges, the resume checks of `compare` and `train`; the slices' rows are in test_slices.py)."""

import copy
import json
from pathlib import Path

import pytest

from trl_nca.testing import load_script


ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "results" / "data"


def _peft():
    from peft import LoraConfig

    from trl_nca.recipes.compare import peft_settings

    return peft_settings(LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize(
    "change, differences, versions",
    [
        ("nothing", [], []),
        ("new peft field unset", [], []),  # peft 0.22.0's `astra_config: null`, as a library unknown here
        ("new peft field at its default", [], []),
        ("peft version", [], [("peft", "0.0.1", "now")]),
        ("renamed version", [], [("library", "0.0.1", None)]),
        ("lora rank", [("peft.r", 16, 8)], []),
        ("new peft field set", [("peft.brand_new_config", {"rank": 4}, "<not set>")], []),
        ("new training field unset", [], []),
        ("new training field at its default", [], []),
        ("new training field set", [("training.a_new_trl_option", 3, "<not set>")], []),
        ("learning rate", [("training.learning_rate", 0.5, 0.001)], []),
        ("a renamed field, recorded under both names", [], []),  # a newer transformers against 5.17
        ("a renamed field, another value", [("training.activation_checkpointing", True, False)], []),
        ("removed field set", [("peft.use_dora", "<not set>", True)], []),
        ("the default schedule, recorded as adaptive", [], []),
        ("gated with an unread init", [], []),
        (
            "adaptive, not gated",
            [("training.nca_adaptive_init", 0.01, "<not set>"), ("training.nca_beta_schedule", "adaptive", "gated")],
            [],
        ),
    ],
)
def test_settings_compare_what_shapes_the_numbers(change, differences, versions):
    from trl_nca.recipes.identity import compare_settings, peft_defaults, training_defaults

    now = {"peft": _peft(), "training": {"learning_rate": 0.001, "max_steps": 4}}
    now["peft"]["peft_version"] = "now"
    old = copy.deepcopy(now)
    if change == "new peft field unset":  # a field unknown to the installed PEFT, unset; one it has, not recorded
        old["peft"]["brand_new_config"] = None
        old["peft"].pop("layers_pattern")
    elif change == "new peft field at its default":
        old["peft"]["qalora_group_size"] = peft_defaults("LORA")["qalora_group_size"]
        now["peft"].pop("qalora_group_size")
    elif change == "peft version":
        old["peft"]["peft_version"] = "0.0.1"
    elif change == "renamed version":
        old["peft"]["library_version"] = "0.0.1"
    elif change == "lora rank":
        old["peft"]["r"] = 16
    elif change == "new peft field set":
        old["peft"]["brand_new_config"] = {"rank": 4}
    elif change == "new training field unset":
        old["training"]["a_new_trl_option"] = None
    elif change == "new training field at its default":  # a field NCAConfig has at its default, unknown to the other
        now["training"]["beta"] = training_defaults()["beta"]
    elif change == "new training field set":
        old["training"]["a_new_trl_option"] = 3
    elif change == "learning rate":
        old["training"]["learning_rate"] = 0.5
    elif change in ("the default schedule, recorded as adaptive", "adaptive, not gated"):
        # the gated anchor ran as `adaptive` with init 0 before it had its name in the registry
        now["training"].update(nca_beta_schedule="gated", nca_adaptive_init=0.0)
        old["training"].update(nca_beta_schedule="adaptive", nca_adaptive_init=0.0)
        if change == "adaptive, not gated":  # the ungated adaptive anchor is another schedule
            old["training"]["nca_adaptive_init"] = 0.01
    elif change == "gated with an unread init":
        now["training"].update(nca_beta_schedule="gated", nca_adaptive_init=0.3)
        old["training"].update(nca_beta_schedule="adaptive", nca_adaptive_init=0)
    elif change.startswith("a renamed field"):  # `gradient_checkpointing` became `activation_checkpointing`
        old["training"].update(gradient_checkpointing=True, activation_checkpointing=True)
        now["training"]["gradient_checkpointing"] = change.endswith("both names")
    elif change == "removed field set":  # a field this library has that the recording one did not: set, it counts
        old["peft"].pop("use_dora")
        now["peft"]["use_dora"] = True
    result = compare_settings(old, now)
    assert result.differences == differences
    assert result.versions == versions


def _quick_summary():
    """The documented quick job's summary as a run with today's libraries would write it: peft 0.22.0's new default
    field and version, another transformers."""
    summary = json.loads((DATA / "main-quick.json").read_text())
    summary["settings"]["student"]["peft"].update(astra_config=None, peft_version="0.22.0")
    summary["versions"] = {**summary["versions"], "peft": "0.22.0", "transformers": "5.99.0"}
    return summary


def test_a_run_with_newer_libraries_is_read_against_its_documented_outcome():
    """The failure of issue 57: peft 0.22.0's serialised LoraConfig made the quick job read against nothing."""
    from trl_nca.recipes.outcomes import read_per_organism

    text = read_per_organism(_quick_summary())
    assert "; documented: opd degraded, nca prevented it." in text
    assert "Documented in docs/results.md section 10.6 (main-quick, the same settings)" in text
    assert (
        "The documented outcome was made with peft 0.21.2, transformers 5.25.0, running peft 0.22.0, transformers 5.99.0"
        in text
    )
    assert "No per-organism outcome" not in text


@pytest.mark.parametrize(
    "change, named",
    [
        ("lora rank", "`student.peft.r` 8 documented, 16 here"),
        ("lora dropout", "`student.peft.lora_dropout` 0.05 documented, 0.0 here"),
        ("target modules", "`student.peft.target_modules`"),
        ("learning rate", "`opd.learning_rate` 0.002 documented, 0.001 here"),
        ("task rows", "`student.train_rows_sha256`"),
    ],
)
def test_a_change_that_shapes_the_numbers_still_reads_against_nothing_and_names_it(change, named):
    from trl_nca.recipes.outcomes import read_per_organism

    summary = _quick_summary()
    student, training = summary["settings"]["student"], summary["settings"]["training"]
    if change == "lora rank":
        student["peft"]["r"] = 16
    elif change == "lora dropout":
        student["peft"]["lora_dropout"] = 0.0
    elif change == "target modules":
        student["peft"]["target_modules"] = ["q_proj"]
    elif change == "learning rate":
        training["learning_rate"] = 0.001
    else:
        student["train_rows_sha256"] = "0" * 64
    text = read_per_organism(summary)
    assert "documented:" not in text
    assert "No per-organism outcome is documented for these settings" in text
    assert "The nearest, main-quick, differs in " in text and named in text, text


def test_the_shipped_configs_are_read_against_their_documented_outcomes():
    """What `.ci/run` checks with the newest releases (`scripts/check_documented.py`), planned without training."""
    script = load_script(ROOT / "scripts" / "check_documented.py")
    assert script.reading(script.CONFIGS[0]).startswith(
        "nca: documented: anchor-shift (section 10, there named 'gated')"
    )
    assert script.reading(script.CONFIGS[1]).startswith("nca: documented: main-quick (section 10.6)")


def test_a_synthetic_new_default_field_in_peft_keeps_the_documented_reading(monkeypatch):
    """A PEFT release that adds a field to LoraConfig (here one with a non-empty default, as the installed PEFT's
    defaults say) changes nothing that is compared; the same field set to another value does."""
    import dataclasses

    import peft
    import trl
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    from trl_nca.recipes import identity
    from trl_nca.recipes.outcomes import documented_for, planned_summary

    @dataclasses.dataclass
    class NewLoraConfig(peft.LoraConfig):
        synthetic_option: int = dataclasses.field(default=3)

    key = next(k for k in PEFT_TYPE_TO_CONFIG_MAPPING if str(getattr(k, "value", k)) == "LORA")
    monkeypatch.setitem(PEFT_TYPE_TO_CONFIG_MAPPING, key, NewLoraConfig)
    identity.peft_defaults.cache_clear()
    real = trl.get_peft_config

    def patched(model_args, option=3):
        config = real(model_args)
        return NewLoraConfig(**{**dataclasses.asdict(config), "synthetic_option": option})

    script = load_script(ROOT / "scripts" / "check_documented.py")
    try:
        monkeypatch.setattr(trl, "get_peft_config", patched)
        assert script.reading(script.CONFIGS[1]).startswith("nca: documented: main-quick")
        monkeypatch.setattr(trl, "get_peft_config", lambda model_args: patched(model_args, option=5))
        text = script.reading(script.CONFIGS[1])
        assert (
            text.startswith("nca: no documented outcome")
            and "`student.peft.synthetic_option` '<not set>' documented, 5 here" in text
        )
    finally:
        identity.peft_defaults.cache_clear()
    assert documented_for and planned_summary


def test_resuming_a_comparison_of_other_versions_warns_and_of_other_settings_refuses(tmp_path, caplog):
    from trl_nca.recipes.compare import CompareInputError, refuse_changed_settings

    now = {"student": {"peft": _peft()}, "training": {"learning_rate": 0.001}}
    old = copy.deepcopy(now)
    old["student"]["peft"]["peft_version"] = "0.0.1"
    old["student"]["peft"]["astra_config"] = None
    old["training"]["a_new_trl_option"] = False
    with caplog.at_level("WARNING"):
        refuse_changed_settings("a comparison", tmp_path / "settings.json", old, now)
    assert "made with peft 0.0.1, running peft " in caplog.text and "versions are provenance" in caplog.text
    old["student"]["peft"]["r"] = 4
    with pytest.raises(CompareInputError, match=r"`student.peft.r` was 4, now 8"):
        refuse_changed_settings("a comparison", tmp_path / "settings.json", old, now)
