"""The tests that run vLLM (marked `vllm`): they run in the environment of scripts/vllm_venv.sh, where .ci/run runs
them, and are skipped elsewhere (tests/conftest.py). One vLLM server, started once per test run (`teacher_server`),
serves the tiny teacher; the engines these tests build in process run in this process (no engine process)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_nca.testing import free_port, save_tiny_model


# vLLM's CPU build: a small KV cache (GiB; the machine's memory is shared), and in-process engines without an engine
# process of their own (no re-import of vLLM in a child: an engine loads in about half the time).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# The tiny test models have 4 attention heads, so vLLM's CPU attention needs a width of 128 (head size 32; it has no
# kernel for the default width 64's head size 16).
VLLM_WIDTH = 128
# How long the server may take to answer: measured on this 2-core machine, 70-80 s at load 5-6 (the import of vLLM in
# the server's two processes is most of it); the REFERENCE's 4 minutes at load 7 with SmolLM2 sets the margin.
SERVER_START_TIMEOUT = 420


@pytest.fixture(scope="session")
def vllm_models(tmp_path_factory):
    """The tiny student (seed 0) and teacher (seed 1) folders at vLLM's width, float32."""
    root = tmp_path_factory.mktemp("vllm-models")
    return (
        save_tiny_model(root / "student", seed=0, hidden_size=VLLM_WIDTH),
        save_tiny_model(root / "teacher", seed=1, hidden_size=VLLM_WIDTH),
    )


def server_command(model: str, port: int) -> list[str]:
    """The teacher server of docs/vllm.md for `model`, float32 (the tolerance of the served loss rests on it)."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]


@pytest.fixture(scope="session")
def teacher_server(vllm_models, tmp_path_factory):
    """A vLLM server of the tiny teacher, started once per test run and stopped after it: its base URL."""
    import requests

    port = free_port()
    log = Path(tmp_path_factory.mktemp("server")) / "server.log"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            server_command(vllm_models[1], port), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the vLLM server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() - start > SERVER_START_TIMEOUT:
                pytest.fail(f"the vLLM server did not answer in {SERVER_START_TIMEOUT} s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        print(f"vLLM server up in {time.monotonic() - start:.0f} s", file=sys.stderr)
        yield url
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
