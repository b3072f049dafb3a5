"""The rollout interface: any object with `spec`, `episodes_per_step`, `seeds(step)` and `rollout(seeds, generate,
tokenizer)` trains with NCATrainer, not only the games."""

import pytest
import torch

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import ContextSpec
from trl_nca.testing import ROLLOUT_RUN, make_tiny_model, make_tiny_tokenizer, run_args
from trl_nca.trainers.rollouts import Rollout, RolloutBatch, RolloutSample


class CountingRollout:
    """Not a game: each seed is one two-call 'episode' asking the student to continue a count; the second call's prompt
    holds the first reply. The context asks to count in steps of two."""

    spec = ContextSpec(column=None, text="unused", placement="system")
    context = "Count in steps of two."

    def __init__(self, episodes_per_step: int = 2):
        self.episodes_per_step = episodes_per_step
        self.calls = []

    def seeds(self, step):
        return [100 * step + j for j in range(self.episodes_per_step)]

    def rollout(self, seeds, generate, tokenizer):
        from trl_nca.core.views import render_prompt_ids

        self.calls.append(list(seeds))
        samples, lengths = [], []
        prompts = [[{"role": "user", "content": f"Continue: {seed}"}] for seed in seeds]
        for _ in range(2):  # two calls per episode, all episodes batched in each
            ids = [render_prompt_ids(tokenizer, p) for p in prompts]
            replies = generate(ids, list(seeds))
            for prompt, reply in zip(prompts, replies):
                samples.append(RolloutSample(prompt, self.context, reply.token_ids))
                lengths.append(len(reply.token_ids))
            prompts = [[{"role": "user", "content": p[0]["content"] + " " + r.text}] for p, r in zip(prompts, replies)]
        return RolloutBatch(samples, {"mean_reply_tokens": sum(lengths) / len(lengths)})


def test_a_rollout_that_is_not_a_game_trains(tmp_path):
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, 0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollout = CountingRollout()
    assert isinstance(rollout, Rollout)
    trainer = NCATrainer(
        model=model,
        args=run_args(NCAConfig, tmp_path, ROLLOUT_RUN, max_new_tokens=5),
        processing_class=tok,
        rollout=rollout,
    )
    batches = []
    original = trainer._play_episodes

    def spy(batch):
        out = original(batch)
        batches.append(trainer.nca_batch(out))
        return out

    trainer._play_episodes = spy
    trainer.train()
    assert rollout.calls == [rollout.seeds(0), rollout.seeds(1)]  # the rollout's schedule, in order
    for batch in batches:
        assert batch.prompts.shape[0] == 4  # two episodes x two calls, one row per sample
        context = tok.batch_decode(batch.context_prompts, skip_special_tokens=True)
        plain = tok.batch_decode(batch.prompts, skip_special_tokens=True)
        assert all(CountingRollout.context in c and CountingRollout.context not in p for c, p in zip(context, plain))
    logs = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert len(logs) == 2 and all("rollout/mean_reply_tokens" in h and "nca_loss" in h for h in logs)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_an_object_that_is_not_a_rollout_is_refused(tmp_path):
    tok = make_tiny_tokenizer()
    with pytest.raises(TypeError, match=r"rollout must implement trl_nca\.trainers\.rollouts\.Rollout .*got a dict"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            args=run_args(NCAConfig, tmp_path, ROLLOUT_RUN, max_new_tokens=5),
            processing_class=tok,
            rollout={"game": "x"},
        )
