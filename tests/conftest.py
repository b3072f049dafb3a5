import os


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402


torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    """The tiny tokenizer, one per test module (a test that changes a tokenizer builds its own)."""
    from trl_nca.testing import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny tokenizer + Llama saved once per test session."""
    from trl_nca.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "student", seed=0)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory):
    from trl_nca.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "teacher", seed=1)


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` run only where vLLM is installed (the environment of scripts/vllm_venv.sh, which .ci/run
    builds); elsewhere they are skipped, with that reason."""
    from trl_nca.core.engines import vllm_available

    if vllm_available():
        return
    skip = pytest.mark.skip(
        reason="vLLM is not installed: these tests run in the venv of scripts/vllm_venv.sh (.ci/run)"
    )
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
