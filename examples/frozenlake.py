r"""Distil the FrozenLake experience into a student by playing games with NCA, then compare win rates paired.

Each optimizer step plays fresh training lakes (3x3, 2 holes, not slippery, 5 moves) with the student, without the
experience; every model call becomes one sample whose teacher view has the experience in the user message. Base model
and student are then evaluated on the 128 held-out lakes, each played once without and once with the experience
(T=0.7, top-p 0.8, top-k 20), next to the oracle ceiling (share of lakes solvable in 5 moves).

    accelerate launch examples/frozenlake.py --config examples/configs/frozenlake.yaml
    python examples/frozenlake.py --model_name_or_path embedded --max_steps 2 --per_device_train_batch_size 2 \
        --eval_seeds 8 --max_new_tokens 64 --eval_max_new_tokens 64 --max_length 4096

The options that matter: `--config` (a YAML file of any options below), `--model_name_or_path` (default `embedded`,
the packaged SmolLM2-135M-Instruct), `--nca_beta` (the anchor's upper bound; 0 is plain OPD), `--max_steps`, `--output_dir`
(default `outputs/frozenlake-nca`; the report goes to its `paired_eval/`), `--game_options` (the lakes), `--experience_file`,
`--eval_seeds` (held-out maps), `--use_peft` with `--lora_r` (a LoRA student), `--skip_eval`.
Every other option below is a field of `NCAConfig` (TRL's `GKDConfig` and `TrainingArguments`, docs/configuration.md)
or of TRL's `ModelConfig`, and each can also be set in the YAML file of `--config`.
"""

import dataclasses
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, TrlParser, get_peft_config

from trl_nca import NCAConfig, NCATrainer
from trl_nca.console import quiet_library_bars
from trl_nca.core.launch import end_process_group, prepare_deepspeed_process
from trl_nca.envs import GameRollout, game_generation_settings
from trl_nca.eval import (
    ModelRun,
    check_game_options,
    game_summary,
    models_after_training,
    run_paired,
    run_provenance,
    write_report,
)
from trl_nca.models.names import resolve_model_name_or_path
from trl_nca.trainers.script_options import SCRIPT_USAGE, ScriptHelpFormatter, resume_checkpoint, student_init_kwargs


GAME = "frozenlake"


@dataclass
class ScriptArguments:
    game_options: str = field(
        default="{}", metadata={"help": 'Game settings as JSON, e.g. \'{"size": 3, "num_holes": 2}\'.'}
    )
    experience_file: str | None = field(default=None, metadata={"help": "Own experience text (default: shipped)."})
    eval_seeds: int = field(default=128, metadata={"help": "Held-out maps for the paired evaluation (paper: 128)."})
    eval_max_new_tokens: int = field(default=1024, metadata={"help": "Tokens per evaluation reply."})
    eval_batch_size: int = field(default=32, metadata={"help": "Evaluation generation batch size."})
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
        args.output_dir = "outputs/frozenlake-nca"
    model_path = resolve_model_name_or_path(model_args.model_name_or_path or "embedded")
    args.model_init_kwargs = student_init_kwargs(args, model_args)  # the user's kwargs, completed by ModelConfig
    experience = Path(script_args.experience_file).read_text() if script_args.experience_file else None

    # The rollout plays `episodes_per_step` fresh training maps per optimizer step; the batch size counts episodes.
    rollout = GameRollout(
        game=GAME,
        env_kwargs=json.loads(script_args.game_options),
        episodes_per_step=args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
        experience=experience,
    )
    resume = resume_checkpoint(args.resume_from_checkpoint, args.output_dir)  # checked before the model loads
    trainer = NCATrainer(model=model_path, args=args, rollout=rollout, peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)

    # Paired evaluation: base model and student, each playing every held-out map without and with the experience.
    # Every process calls models_after_training; after a distributed run the main process evaluates the saved student.
    models = None if script_args.skip_eval else models_after_training(trainer, model_path)
    if models is not None:
        out = Path(args.output_dir) / "paired_eval"
        experience = dataclasses.replace(rollout.spec, column=None, text=rollout.experience)
        task = check_game_options(GAME, {"num_seeds": script_args.eval_seeds, **rollout.env_kwargs}, experience)
        settings = game_generation_settings(
            max_new_tokens=script_args.eval_max_new_tokens, batch_size=script_args.eval_batch_size
        )
        runs, summaries = [], {}
        pairs = (("base", models.base, models.base_context), ("student", models.student, nullcontext))
        for name, model, block in pairs:
            records_path = out / name / "records.jsonl"  # appended map by map: a rerun resumes
            with block():  # the base of a LoRA student is the student with its adapter disabled
                provenance = run_provenance(task, model, trainer.processing_class, generation=settings)
                records = run_paired(
                    task,
                    model,
                    trainer.processing_class,
                    generation=settings,
                    output_path=records_path,
                    provenance=provenance,
                )
            runs.append(ModelRun(name, records, provenance=provenance, records_path=str(records_path)))
            summaries[name] = game_summary(records)
        write_report(runs, out, title=f"{Path(args.output_dir).name}: paired win rates", extra={"games": summaries})
        for name, s in summaries.items():
            print(
                f"{name}: win rate {s['win_rate_x']:.3f} without / {s['win_rate_xc']:.3f} with experience, "
                f"harm {s['harm']}, help {s['help']}, oracle ceiling {s['oracle_ceiling']:.3f}"
            )


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
