"""A teacher behind a vLLM server: the privileged-context teacher of NCA scored by another process (or node), the
student's two views kept local.

`ServedTeacher` answers the `Teacher` protocol (`trl_nca.trainers.teacher`) and one more question, its top-k: for the
teacher's view (context, prompt and completion) it asks the server for the k most likely tokens at every completion
position, through TRL's `VLLMClient.get_sequence_logprobs` (the call TRL's `ServerDistillationTrainer` makes), and
the divergences sum over those ids (`trl_nca.core.losses.TeacherTopK`, `divergence_support="teacher_top_k"`): the same
loss a local teacher gives on its own top-k. A separate teacher is a server of that model; self-distillation from the
student's initial weights is a server of the student's starting checkpoint.

Before any work: the server must answer (one line naming the address and the fix, after waiting
`teacher_model_server_timeout` seconds), its tokenizer must give the student's ids (`check_tokenizer`), and with a
temperature other than 1 it must apply it (`--logprobs-mode processed_logprobs`). During training, a server that stops
answering, or answers slower than `teacher_model_server_request_timeout`, raises `TeacherServerLost`, which
`stop_with_checkpoint` turns into a checkpoint at the last step boundary and a line saying how to resume.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from ..core.losses import TeacherTopK
from ..core.views import View


SERVER_COMMAND = (
    "python -m vllm.entrypoints.openai.api_server --model TEACHER --logprobs-mode processed_logprobs --max-logprobs -1"
)


class TeacherServerError(ValueError):
    """The teacher server cannot serve this run (unreachable at the start, another tokenizer, raw log-probabilities);
    raised before any work, with the fix."""


class TeacherServerLost(RuntimeError):
    """The teacher server stopped answering during training (connection lost, an error, or slower than the request
    timeout)."""


def _client(url: str, timeout: float, request_timeout: float, retries: int):
    """TRL's `VLLMClient` for `url`, its requests bounded by `request_timeout` seconds and `retries` retries."""
    import requests
    from requests.adapters import HTTPAdapter
    from trl.generation.vllm_client import VLLMClient
    from urllib3.util.retry import Retry

    class Client(VLLMClient):
        def _post(self, url, **kwargs):
            return super()._post(url, timeout=request_timeout, **kwargs)

        def _get(self, url, **kwargs):
            return super()._get(url, timeout=request_timeout, **kwargs)

    try:
        client = Client(base_url=url, connection_timeout=timeout)
    except (ConnectionError, requests.RequestException) as error:
        raise TeacherServerError(
            f"No teacher server answers at {url} (waited {timeout:g} s: {type(error).__name__}). Start it with "
            f"`{SERVER_COMMAND}` (the teacher's checkpoint, or the student's for self-distillation), or correct "
            "`teacher_model_server_url`."
        ) from None
    # read=False: a request that timed out is not retried, and its timeout is raised as one
    retry = Retry(total=retries, connect=retries, read=False, status=retries, backoff_factor=1, allowed_methods=None)
    retry.status_forcelist = [500, 502, 503]
    client.session.mount("http://", HTTPAdapter(max_retries=retry))
    client.session.mount("https://", HTTPAdapter(max_retries=retry))
    return client


class ServedTeacher(nn.Module):
    """The teacher of a run, served by vLLM at `url` (a `Teacher` with no parameters; see the module docstring).

    `top_k`: how many of the teacher's tokens are scored per completion token. `temperature`: the loss's temperature,
    which the server applies. `timeout`: seconds to wait for the server at the start. `request_timeout`: seconds one
    scoring request may take. `retries`: retries of a failed request before the server counts as lost."""

    owns_weights = False
    live = False

    def __init__(
        self,
        url: str,
        *,
        top_k: int,
        temperature: float = 1.0,
        timeout: float = 240.0,
        request_timeout: float = 600.0,
        retries: int = 3,
    ):
        super().__init__()
        self.url, self.top_k, self.temperature = url, top_k, temperature
        self.client = _client(url, timeout, request_timeout, retries)
        self.request_timeout = request_timeout

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield None  # nothing local scores

    def weights_key(self, model) -> None:
        return None

    def call(self, fn, *args):
        raise TypeError("A served teacher has no local forward; the objective asks it for its top-k instead.")

    def forward(self, *args, **kwargs):
        raise TypeError("A served teacher has no local forward; the objective asks it for its top-k instead.")

    def check_tokenizer(self, tokenizer) -> None:
        """The served model's tokenizer must give the student's ids: a probe with the student's special tokens, its
        chat template and a spread of its vocabulary is tokenised by both (the server's `/tokenize`)."""
        probe = _probe_text(tokenizer)
        expected = tokenizer(probe, add_special_tokens=False)["input_ids"]
        payload = {"model": self.client.model, "prompt": probe, "add_special_tokens": False}
        served = self._request("/tokenize", payload)["tokens"]
        if served != expected:
            first = next(
                (i for i, (a, b) in enumerate(zip(expected, served)) if a != b), min(len(expected), len(served))
            )
            raise TeacherServerError(
                f"The teacher server at {self.url} serves {self.client.model!r}, whose tokenizer does not give the "
                f"student's ids (a probe of {len(expected)} student tokens is {len(served)} served tokens, first "
                f"difference at token {first}). The losses compare the two distributions id by id: serve a teacher "
                "of the student's model family, or the student's own checkpoint for self-distillation."
            )
        if self.temperature != 1.0:
            self._check_temperature(expected[:16])

    def _check_temperature(self, ids: list[int]) -> None:
        """With a temperature other than 1 the server must apply it to the scores (vLLM does only with
        `--logprobs-mode processed_logprobs`)."""
        scored = [self._score([ids], [1], temperature)["logprobs"][0] for temperature in (1.0, self.temperature)]
        if scored[0] == scored[1]:
            raise TeacherServerError(
                f"The teacher server at {self.url} returns the same log-probabilities at temperature "
                f"{self.temperature:g} as at 1, so it does not apply the loss's temperature: restart it with "
                "`--logprobs-mode processed_logprobs`."
            )

    def _request(self, path: str, payload: dict) -> dict:
        import requests

        try:
            response = self.client.session.post(f"{self.url}{path}", json=payload, timeout=self.request_timeout)
        except requests.RequestException as error:
            raise TeacherServerLost(_lost(self.url, error, self.request_timeout)) from None
        if response.status_code != 200:
            raise TeacherServerError(f"The teacher server at {self.url} refused {path}: {response.text[:300]}")
        return response.json()

    def _score(self, sequences: list[list[int]], prompt_lengths: list[int], temperature: float) -> dict:
        import requests

        try:
            return self.client.get_sequence_logprobs(
                sequences=sequences, prompt_lengths=prompt_lengths, top_logprobs=self.top_k, temperature=temperature
            )
        except requests.RequestException as error:
            raise TeacherServerLost(_lost(self.url, error, self.request_timeout)) from None
        except Exception as error:  # VLLMClient raises a bare Exception for an answer other than 200
            raise TeacherServerLost(f"The teacher server at {self.url} failed a scoring request: {error}") from None

    @torch.no_grad()
    def top_k_log_probs(self, view: View, completion_mask: torch.Tensor) -> TeacherTopK:
        """The teacher's top-k of every valid completion token of `view` (the context view), in the order of the
        objective's hidden states (row by row). The view lacks the block's last completion column (nothing is
        predicted from it), so each row's last completion token is sent as id 0: the distribution at a position does
        not depend on the token there."""
        mask = view.attention_mask.bool()
        lengths = completion_mask.sum(1).tolist()
        sequences, prompt_lengths, rows = [], [], []
        for row, length in enumerate(lengths):
            if length == 0:
                continue
            prompt = view.input_ids[row, : view.prompt_width][mask[row, : view.prompt_width]].tolist()
            completion = view.input_ids[row, view.prompt_width : view.prompt_width + length - 1].tolist()
            sequences.append(prompt + completion + [0])
            prompt_lengths.append(len(prompt))
            rows.append(length)
        device = view.input_ids.device
        if not sequences:
            empty = torch.zeros(0, self.top_k, device=device)
            return TeacherTopK(empty.long(), empty)
        result = self._score(sequences, prompt_lengths, self.temperature)
        ids, log_probs = [], []
        for length, row_ids, row_values in zip(rows, result["logprob_token_ids"], result["logprobs"]):
            if len(row_ids) != length or any(not math.isfinite(v) for values in row_values for v in values):
                raise TeacherServerLost(
                    f"The teacher server at {self.url} returned {len(row_ids)} scored positions for a completion of "
                    f"{length} tokens, or fewer than {self.top_k} tokens per position: start it with "
                    "`--max-logprobs -1` (or at least the loss's top-k)."
                )
            ids += row_ids
            log_probs += row_values
        return TeacherTopK(
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(log_probs, dtype=torch.float32, device=device),
        )


def _lost(url: str, error: Exception, timeout: float) -> str:
    import requests

    if isinstance(error, requests.Timeout):
        return f"The teacher server at {url} did not answer within {timeout:g} s (teacher_model_server_request_timeout)"
    return f"The teacher server at {url} stopped answering ({type(error).__name__})"


def _probe_text(tokenizer) -> str:
    """Text whose tokens cover the student's special tokens, its chat template and its whole vocabulary (each id
    decoded on a line of its own: two tokenizers that map one token to different ids tokenise that line differently),
    and every byte of UTF-8."""
    parts = list(getattr(tokenizer, "all_special_tokens", []))
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": "Context."}, {"role": "user", "content": "Question 12?"}]
        parts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    parts += tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    # every byte of UTF-8 in some character (a byte-level vocabulary's tokens of single non-ASCII bytes decode to no
    # text of their own): two-byte characters cover the continuation bytes and the two-byte leads, then samples of
    # three- and four-byte characters
    parts.append("".join(chr(c) for c in range(0xA0, 0x800)))
    wide = [*range(0x800, 0xD800, 0x1000), *range(0xE000, 0x10000, 0x1000), *range(0x10000, 0x110000, 0x40000)]
    parts.append("".join(map(chr, wide)))
    return "\n".join(parts)


def served_teacher(args, teacher_model):
    """The teacher of a run: a `ServedTeacher` connected to `args.teacher_model_server_url` when it is set (no
    `teacher_model` may be given then), else `teacher_model` as it is."""
    url = getattr(args, "teacher_model_server_url", None)
    if url is None:
        return teacher_model
    if teacher_model is not None or getattr(args, "teacher_model_name_or_path", None) is not None:
        raise ValueError(
            "teacher_model_server_url is set and a teacher model is given too: the teacher is either served or "
            "local. Drop the teacher model (the server scores), or drop teacher_model_server_url."
        )
    return ServedTeacher(
        url.rstrip("/"),
        top_k=args.support_size,
        temperature=args.temperature,
        timeout=args.teacher_model_server_timeout,
        request_timeout=args.teacher_model_server_request_timeout,
        retries=args.teacher_model_server_retries,
    )


@contextlib.contextmanager
def stop_with_checkpoint(trainer) -> Iterator[None]:
    """Training in which a lost teacher server ends the run at the last step boundary: the gradients of the step under
    way are dropped, a checkpoint of the completed steps is saved, and the error says how to resume."""
    try:
        yield
    except TeacherServerLost as error:
        trainer.model.zero_grad(set_to_none=True)
        trainer._save_checkpoint(trainer.model, trial=None)
        folder = f"{trainer.args.output_dir}/checkpoint-{trainer.state.global_step}"
        raise TeacherServerLost(
            f"{error} during step {trainer.state.global_step + 1}. Saved {folder} (the {trainer.state.global_step} "
            "completed steps). Start the server again and resume with `trainer.train(resume_from_checkpoint=True)` "
            "(`--resume_from_checkpoint true` on the command line)."
        ) from None
