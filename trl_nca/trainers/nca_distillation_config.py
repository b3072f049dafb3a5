"""`NCADistillationConfig`: the configuration of `NCADistillationTrainer`, on TRL's `DistillationConfig`, with the NCA
fields of `trl_nca.trainers.nca_config.NCAFields`.

Each field is documented once, in its `metadata["help"]`; `trl_nca.trainers.field_docs.document_fields` writes the same
text into the class docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from trl import DistillationConfig

from .field_docs import document_fields
from .nca_config import NCAFields, support_size_field


@document_fields(after={"divergence_top_k": "divergence_support"})
@dataclass
class NCADistillationConfig(NCAFields, DistillationConfig):
    r"""
    Configuration class for [`NCADistillationTrainer`]: NCA on TRL's stable `DistillationTrainer` (vLLM sampling).

    The loss is [`NCAConfig`]'s (OPD + `nca_beta` * NCA per completion token; the formulas: `trl_nca.core.losses`).
    All fields of [`~trl.DistillationConfig`] keep
    their meaning and defaults (sampling: `temperature`, `top_p`, `top_k`, `min_p`, `max_completion_length`,
    `use_vllm` and the `vllm_*` fields; `beta` selects the OPD divergence as in `NCAConfig`); the NCA fields below are
    the same as `NCAConfig`'s, declared once in [`NCAFields`], except:

        - the size of the top-k divergence support is `divergence_top_k` (`NCAConfig.top_k`), since `top_k` is
          already `DistillationConfig`'s sampling top-k;
        - `eval_completions` must be `"on_policy"` (the trainer always samples its completions) and
          `log_grad_cosine_steps` must be 0 (not available on this trainer; `trl-nca analyze` measures it on saved
          checkpoints);
        - `bf16=None` resolves to `True` only on a CUDA device with bfloat16 support, as in `NCAConfig`.

    `max_completion_length` bounds the completion of every row when the context view's length is checked against
    `max_context_length`. There is no `lmbda` or `seq_kd`: every step is on-policy.
    """

    divergence_top_k: int = support_size_field()
    teacher_model_server_url: str | None = field(
        default=None,
        metadata={
            "help": "Base URL of a vLLM server that scores the teacher's view (e.g. `http://localhost:8000`), as in "
            "TRL's `ServerDistillationConfig`; no teacher model is then loaded. Needs "
            "`divergence_support='teacher_top_k'` (the server returns the teacher's `divergence_top_k` most likely "
            "tokens). The server: docs/vllm.md."
        },
    )
    teacher_model_server_timeout: float = field(
        default=240.0,
        metadata={"help": "Seconds to wait at the start for the teacher server to answer."},
    )
    teacher_model_server_request_timeout: float = field(
        default=600.0,
        metadata={
            "help": "Seconds one scoring request to the teacher server may take; a slower answer stops the run at "
            "the last step boundary, with a checkpoint."
        },
    )
    teacher_model_server_retries: int = field(
        default=3,
        metadata={"help": "Retries of a scoring request the teacher server failed before the run stops."},
    )

    _support_size_name: ClassVar[str] = "divergence_top_k"

    def __post_init__(self):
        self._check_nca_numbers(integers=("max_completion_length",))
        self._nca_defaults()
        super().__post_init__()
        self._check_nca_choices()
        if self.eval_completions != "on_policy":
            raise ValueError(
                f"eval_completions={self.eval_completions!r} is not available with NCADistillationTrainer, which "
                "always scores completions it samples (as DistillationTrainer does). Set eval_completions='on_policy', "
                "or use NCATrainer to evaluate the dataset's reference completions."
            )
        if self.teacher_model_server_url is not None and self.divergence_support != "teacher_top_k":
            raise ValueError(
                f"teacher_model_server_url is set with divergence_support={self.divergence_support!r}: a served "
                "teacher gives only its top-k tokens. Set divergence_support='teacher_top_k' (and divergence_top_k, "
                "the tokens scored per position), or drop teacher_model_server_url for a local teacher."
            )
        if self.log_grad_cosine_steps:
            raise ValueError(
                "log_grad_cosine_steps is not available with NCADistillationTrainer. Set it to 0, and measure the "
                "gradient cosine with NCATrainer or on saved checkpoints with `trl-nca analyze`."
            )
