"""Distil a medical-expert system prompt into a student on MedMCQA with NCA, then evaluate it paired.

Subject split as in the paper: train on Gynaecology & Obstetrics, Medicine, Pharmacology, Pathology; test on Dental,
Anatomy, Surgery, Pediatrics (the Hub's validation split, since test labels are hidden).

    accelerate launch examples/medmcqa.py --config examples/configs/medmcqa.yaml
    python examples/medmcqa.py --model_name_or_path embedded --max_steps 4 --train_limit 64 --eval_limit 32
"""

from _qa_common import run
from datasets import load_dataset

from trl_nca.tasks import MEDMCQA_TEST_SUBJECTS, MEDMCQA_TRAIN_SUBJECTS, build_medmcqa


def build_splits(qa):
    if qa.dataset_path:
        train_raw = test_raw = load_dataset(qa.dataset_path.rsplit(".", 1)[-1].replace("jsonl", "json"),
                                            data_files=qa.dataset_path, split="train")  # fmt: skip
    else:
        train_raw = load_dataset("openlifescienceai/medmcqa", split="train")
        test_raw = load_dataset("openlifescienceai/medmcqa", split="validation")
    train = build_medmcqa(train_raw, MEDMCQA_TRAIN_SUBJECTS, limit=qa.train_limit)
    test = build_medmcqa(test_raw, MEDMCQA_TEST_SUBJECTS, limit=qa.eval_limit)
    return train, test


if __name__ == "__main__":
    run(build_splits, context_name="medical", scorer="mcq", default_output="outputs/medmcqa-nca")
