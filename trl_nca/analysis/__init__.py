"""Mechanistic measures of context distillation (`trl-nca analyze`): what the training did inside the student.

- `compare_views`: per-layer cosine similarity of the hidden states of the no-context and the context view on the
  same completion tokens, and the per-token KL(q_x || q_c) between the two views along the completion.
- `update_norms`: the update per layer and module type, ||W_student - W_base|| / ||W_base||, from full weights or a
  PEFT adapter.
- `opd_nca_gradient_cosine`: the cosine between the OPD and the NCA gradients over the trainable parameters.
- `analyze_model` runs all of them on one model; `write_analysis` writes JSON, Markdown and PNG figures.

Items (prompts in both views plus one shared completion) come from `prepare_prompts` + `sample_items`, or from the
records of `trl-nca eval` with `items_from_records`. See docs/analysis.md for what each number means.
"""

from .items import (
    AnalysisInputError,
    PromptItem,
    RecordItems,
    RecordsInfo,
    end_token_id,
    items_from_records,
    prepare_prompts,
    prompt_item,
    sample_items,
)
from .measures import (
    AnalysisItem,
    ParameterLocation,
    TopToken,
    UpdateNorms,
    ViewComparison,
    compare_views,
    opd_nca_gradient_cosine,
    parameter_location,
    trainable_parameters,
    update_norms,
)
from .report import markdown, write_analysis
from .run import AnalysisOptions, ModelSpec, analyze_model, load_model, parse_model_specs


__all__ = [
    "AnalysisInputError",
    "AnalysisItem",
    "AnalysisOptions",
    "ModelSpec",
    "ParameterLocation",
    "PromptItem",
    "RecordItems",
    "RecordsInfo",
    "TopToken",
    "UpdateNorms",
    "ViewComparison",
    "analyze_model",
    "compare_views",
    "end_token_id",
    "items_from_records",
    "load_model",
    "markdown",
    "opd_nca_gradient_cosine",
    "parameter_location",
    "parse_model_specs",
    "prepare_prompts",
    "prompt_item",
    "sample_items",
    "trainable_parameters",
    "update_norms",
    "write_analysis",
]
