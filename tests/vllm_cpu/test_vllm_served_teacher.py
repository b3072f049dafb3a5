"""NCA with a served teacher (`trl_nca.trainers.served_teacher`) against a real vLLM server process on CPU: the loss
and the update equal those of the same teacher held locally on its own top-k, for a separate teacher and for
self-distillation; and the server's faults (down at the start, another tokenizer, lost mid-run, too slow)."""

import http.server
import threading
import time

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_nca import NCADistillationConfig, NCADistillationTrainer
from trl_nca.testing import (
    KL32,
    ONE_SGD_STEP,
    Tolerance,
    cloned_parameters,
    free_port,
    permuted_tokenizer,
    prompt_dataset,
    run_args,
)
from trl_nca.trainers.checkpoints import checkpoint_problem
from trl_nca.trainers.served_teacher import TeacherServerError, TeacherServerLost


pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# One SGD step at learning rate 1 without clipping (the update is the gradient), 4 rows, 8 sampled tokens, the
# teacher's top 5 tokens per position.
STEP = {**ONE_SGD_STEP, "divergence_support": "teacher_top_k", "divergence_top_k": 5}


def one_step(student_path, teacher, directory, **fields):
    """One step of NCADistillationTrainer: the logged terms and the weight update."""
    student = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32)
    before = cloned_parameters(student)
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=run_args(
            NCADistillationConfig, directory, {**STEP, "bf16": False, "use_cpu": True, "report_to": []}, **fields
        ),
        train_dataset=prompt_dataset(),
        processing_class=AutoTokenizer.from_pretrained(student_path),
    )
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    return log, {n: p.detach() - before[n] for n, p in student.named_parameters()}


# The server's float32 log-probabilities of the tiny teacher differ from Transformers' float32 ones by at most 4.8e-7
# (measured on 39 positions x 6 tokens; Transformers' float32 and float64 differ by 5.5e-7 there): a few u32 * |log p|.
TEACHER_LOG_PROB_ERROR = 1e-6


@pytest.mark.numerics
@pytest.mark.parametrize("case", ["separate", "self"])
def test_served_teacher_equals_the_local_teacher_on_its_top_k(case, vllm_models, teacher_server, tmp_path):
    """The server serves the tiny teacher (float32). Separate teacher: the student is another model, the local teacher
    is the served checkpoint. Self-distillation: the student is the served checkpoint and the local teacher its frozen
    initial copy. Error model: every teacher log-probability differs between the server and Transformers by at most
    TEACHER_LOG_PROB_ERROR; the KL terms are p-weighted sums of such differences, so they agree to KL32. The gradient is
    linear in the teacher's log-probabilities with the student's probabilities as weights, and its size is that of
    the log-probability differences between student and teacher, whose token mean is about |opd_loss|: the update's
    error, relative to its largest entry, is some TEACHER_LOG_PROB_ERROR / |opd_loss|, more in the attention's query
    and key weights, whose gradients cancel most (measured: at most 4.0e-4 there, 6e-5 elsewhere, against 1 /
    |opd_loss| = 125 and 435 for the two cases); the bound takes 16 of them (2e-3 and 7e-3), while a real error, a
    token misaligned or another support, moves the update by O(1)."""
    student_path, teacher_path = vllm_models
    if case == "self":
        student_path, local_teacher = teacher_path, None
    else:
        local_teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32)
    served_log, served_update = one_step(
        student_path, None, tmp_path / "served", teacher_model_server_url=teacher_server
    )
    local_log, local_update = one_step(student_path, local_teacher, tmp_path / "local")
    for name in ("opd_loss", "nca_loss", "loss"):
        assert served_log[name] == KL32.approx(local_log[name]), name
    # a loss to compare: the student differs from its teacher on the teacher's top-k (a sum over the top-k of a KL's
    # terms, without renormalisation, may be negative)
    assert abs(local_log["opd_loss"]) > 1e-3
    bound = 16 * TEACHER_LOG_PROB_ERROR / abs(local_log["opd_loss"])
    tolerance = Tolerance("SERVED32", rtol=0.0, atol=bound, why="the docstring's error model")
    for name, update in served_update.items():
        scale = local_update[name].abs().max()
        difference = ((update - local_update[name]).abs().max() / scale).item()
        print(f"{case} {name}: largest difference {difference:.2e} of the largest entry (bound {bound:.1e})")
        tolerance.close(update, local_update[name], msg=f"{name}: {difference:.2e} > {bound:.1e}", scale=scale)


class Proxy:
    """A forwarding HTTP proxy to the real server, which a test stops (the server lost) or slows (`delay` seconds)."""

    def __init__(self, target: str, port: int | None = None, delay: float = 0.0):
        self.target, self.delay = target, delay
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self, method):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(proxy.delay)
                try:
                    answer = requests.request(method, proxy.target + self.path, data=body, headers=dict(self.headers))
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except (OSError, requests.RequestException):
                    # the client gave up first (the timeout row), or the test ended while a delayed request slept
                    pass

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

            def log_message(self, *args):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port or free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def trainer_for(vllm_models, directory, url, tokenizer=None, **fields):
    student_path = vllm_models[0]
    return NCADistillationTrainer(
        model=student_path,
        args=run_args(
            NCADistillationConfig,
            directory,
            {**STEP, "bf16": False, "use_cpu": True, "report_to": []},
            teacher_model_server_url=url,
            **fields,
        ),
        train_dataset=prompt_dataset(8),
        processing_class=tokenizer or AutoTokenizer.from_pretrained(student_path),
    )


def test_server_down_at_the_start_is_one_line_before_any_work(vllm_models, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TeacherServerError) as error:
        trainer_for(vllm_models, tmp_path, url, teacher_model_server_timeout=1)
    message = str(error.value)
    assert "\n" not in message and f"No teacher server answers at {url}" in message
    assert "vllm.entrypoints.openai.api_server" in message
    assert not any(tmp_path.iterdir())


def test_a_served_model_with_another_tokenizer_is_refused_before_the_first_step(vllm_models, teacher_server, tmp_path):
    """The student's tokenizer maps two tokens to each other's ids: the server's does not, and the run stops before
    its first step."""
    with pytest.raises(TeacherServerError, match="whose tokenizer does not give the student's ids") as error:
        trainer_for(vllm_models, tmp_path, teacher_server, tokenizer=permuted_tokenizer())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("fault", ["lost", "timeout"])
def test_a_server_lost_mid_run_stops_at_a_step_boundary_with_a_checkpoint(fault, vllm_models, teacher_server, tmp_path):
    """Step 1 scores through a proxy; before step 2 the proxy stops (the server lost) or answers after the request
    timeout. The run stops with checkpoint-1 saved and a line saying how to resume; with the server back, the run
    resumes from it and finishes."""
    proxy = Proxy(teacher_server)
    trainer = trainer_for(
        vllm_models,
        tmp_path,
        proxy.url,
        max_steps=3,
        teacher_model_server_request_timeout=2,
        teacher_model_server_retries=1,
    )

    class Fault:
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                if fault == "lost":
                    proxy.stop()
                else:
                    proxy.delay = 5

    from transformers import TrainerCallback

    trainer.add_callback(type("FaultCallback", (Fault, TrainerCallback), {})())
    with pytest.raises(TeacherServerLost) as error:
        trainer.train()
    message = str(error.value)
    folder = tmp_path / "checkpoint-1"
    assert "\n" not in message and f"Saved {folder}" in message and "resume_from_checkpoint" in message
    assert ("did not answer within 2 s" in message) == (fault == "timeout")
    assert checkpoint_problem(folder) is None
    assert trainer.state.global_step == 1

    port = int(proxy.url.rsplit(":", 1)[1])
    if fault == "lost":
        proxy = Proxy(teacher_server, port=port)
    else:
        proxy.delay = 0
    resumed = trainer_for(vllm_models, tmp_path, proxy.url, max_steps=3)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    proxy.stop()
