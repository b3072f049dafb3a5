"""What the commands' bad-input files share."""

import importlib

import pytest


# Where each command loads its first model: a bad input must be reported before any of them is called.
MODEL_LOADERS = (
    ("trl_nca.eval.loading", "load_model"),  # eval, experience, the harness tasks
    ("trl_nca.cli.analyze", "load_model"),  # analyze (imported by name there)
    ("trl_nca.trainers.setup", "create_model_from_path"),  # train
    ("trl_nca.recipes.compare_eval", "load_base"),  # compare's bases
    ("trl_nca.recipes.compare_students", "load_base"),  # compare's students (imported by name there)
)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model is the first piece of work: any case that reaches it fails the test."""

    def refused(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    for module, name in MODEL_LOADERS:
        monkeypatch.setattr(importlib.import_module(module), name, refused)
