"""Distil a content-analyst system prompt into a student for yes/no safety classification with NCA, then evaluate it
paired.

Uses the papers' prepared splits on the Hub (`ytz20/sys_safety_train`, `ytz20/sys_safety_test`: chat messages and a
yes/no answer; train tasks LIAR, HateCheck, TweetEval offensive, sarcasm; test ETHOS and Anthropic HH harmless).

    accelerate launch examples/safety.py --config examples/configs/safety.yaml

The options that matter: `--config` (a YAML file of any options below), `--model_name_or_path` (default `embedded`,
the packaged SmolLM2-135M-Instruct), `--nca_beta` (the anchor's upper bound; 0 is plain OPD), `--max_steps`, `--output_dir`
(default `outputs/safety-nca`; the report goes to its `paired_eval/`), `--dataset_path` (a local file instead of
the Hub), `--train_limit` and `--eval_limit`, `--use_peft` with `--lora_r` (a LoRA student), `--skip_eval`.
Every other option below is a field of `NCAConfig` (TRL's `GKDConfig` and `TrainingArguments`, docs/configuration.md)
or of TRL's `ModelConfig`, and each can also be set in the YAML file of `--config`.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import load_dataset
from trl import ModelConfig, TrlParser, get_peft_config

from trl_nca import NCAConfig, NCATrainer
from trl_nca.console import quiet_library_bars
from trl_nca.core.launch import end_process_group, prepare_deepspeed_process
from trl_nca.eval import GenerationSettings
from trl_nca.eval.compare import compare_base_and_student
from trl_nca.inputs import read_context
from trl_nca.models.names import resolve_model_name_or_path
from trl_nca.tasks import build_prepared
from trl_nca.trainers.script_options import SCRIPT_USAGE, ScriptHelpFormatter, resume_checkpoint, student_init_kwargs


@dataclass
class ScriptArguments:
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local .jsonl/.parquet instead of the Hub dataset (same schema)."}
    )
    train_limit: int | None = field(default=None, metadata={"help": "Use only the first N training items."})
    eval_limit: int = field(default=500, metadata={"help": "Evaluate on the first N test items (paper: 500)."})
    eval_max_new_tokens: int = field(default=512, metadata={"help": "Tokens per evaluation answer (paper: 512)."})
    eval_batch_size: int = field(default=16, metadata={"help": "Evaluation generation batch size."})
    skip_eval: bool = field(default=False, metadata={"help": "Train only."})


def main(argv: list[str] | None = None) -> None:
    """Train, then evaluate paired; `argv`: the command-line options (default: `sys.argv[1:]`)."""
    prepare_deepspeed_process(sys.argv[1:] if argv is None else argv)  # before the config starts DeepSpeed
    parser = TrlParser(
        (ScriptArguments, NCAConfig, ModelConfig),
        usage=SCRIPT_USAGE,
        description=__doc__,
        formatter_class=ScriptHelpFormatter,
    )
    script_args, args, model_args = parser.parse_args_and_config(args=argv)
    quiet_library_bars()  # no weights-loading or shard-writing bars; TRL_NCA_VERBOSE=1 keeps them
    if args.output_dir in (None, "trainer_output"):
        args.output_dir = "outputs/safety-nca"
    model_path = resolve_model_name_or_path(model_args.model_name_or_path or "embedded")
    args.model_init_kwargs = student_init_kwargs(args, model_args)  # the user's kwargs, completed by ModelConfig
    if args.context_text is None:
        args.context_text = read_context("safety")  # the distilled system prompt; the student never sees it
    resume = resume_checkpoint(args.resume_from_checkpoint, args.output_dir)  # checked before the model loads

    # Prepared rows -> `id`, `prompt` (the user turns, without the papers' system prompt), `answer` (yes/no)
    if script_args.dataset_path:
        file_format = script_args.dataset_path.rsplit(".", 1)[-1].replace("jsonl", "json")
        train_raw = test_raw = load_dataset(file_format, data_files=script_args.dataset_path, split="train")
    else:
        train_raw = load_dataset("ytz20/sys_safety_train", split="train")
        test_raw = load_dataset("ytz20/sys_safety_test", split="train")
    train = build_prepared(train_raw, script_args.train_limit)
    test = build_prepared(test_raw, script_args.eval_limit)

    trainer = NCATrainer(model=model_path, args=args, train_dataset=train, peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)

    # Paired evaluation: base model and student, each answering every test item without and with the system prompt.
    # Every process calls it; after a distributed run the main process evaluates the saved student alone.
    if not script_args.skip_eval:
        settings = GenerationSettings(
            max_new_tokens=script_args.eval_max_new_tokens,
            temperature=1.0,
            top_p=0.95,
            top_k=20,
            batch_size=script_args.eval_batch_size,
        )
        out = Path(args.output_dir) / "paired_eval"
        report = compare_base_and_student(
            trainer, test, base_model_path=model_path, scorer="yesno", generation=settings, output_dir=out
        )
        if report is not None:  # the main process
            print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
