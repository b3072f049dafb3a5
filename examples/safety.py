"""Distil a content-analyst system prompt into a student for yes/no safety classification with NCA.

Uses the papers' prepared splits on the Hub (`ytz20/sys_safety_train`, `ytz20/sys_safety_test`: chat messages and a
yes/no answer; train tasks LIAR, HateCheck, TweetEval offensive, sarcasm; test ETHOS and Anthropic HH harmless).

    accelerate launch examples/safety.py --config examples/configs/safety.yaml
"""

from _qa_common import run
from datasets import load_dataset

from trl_nca.tasks import build_prepared


def build_splits(qa):
    if qa.dataset_path:
        fmt = qa.dataset_path.rsplit(".", 1)[-1].replace("jsonl", "json")
        train_raw = test_raw = load_dataset(fmt, data_files=qa.dataset_path, split="train")
    else:
        train_raw = load_dataset("ytz20/sys_safety_train", split="train")
        test_raw = load_dataset("ytz20/sys_safety_test", split="train")
    return build_prepared(train_raw, qa.train_limit), build_prepared(test_raw, qa.eval_limit)


if __name__ == "__main__":
    run(build_splits, context_name="safety", scorer="yesno", default_output="outputs/safety-nca")
