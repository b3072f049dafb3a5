"""NCATrainer on played text-game episodes: every model call of every episode becomes one sample."""

import pytest
import torch

from trl_nca import NCAConfig, NCATrainer
from trl_nca.envs.rollout import GameRollout
from trl_nca.testing import ROLLOUT_RUN, make_tiny_model, make_tiny_tokenizer, run_args


@pytest.mark.parametrize("game", ["frozenlake", "sokoban"])
def test_two_step_game_training(tmp_path, game):
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, 0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollout = GameRollout(game=game, episodes_per_step=2, max_calls=2)
    trainer = NCATrainer(
        model=model,
        args=run_args(NCAConfig, tmp_path, ROLLOUT_RUN, max_new_tokens=6),
        processing_class=tok,
        rollout=rollout,
    )
    played = []
    original = trainer._play_episodes

    def spy(batch):
        out = original(batch)
        played.append((batch["seed"].tolist(), trainer.nca_batch(out)))
        return out

    trainer._play_episodes = spy
    trainer.train()
    # The seed schedule: step k plays rollout.seeds(k), in order.
    assert [seeds for seeds, _ in played] == [rollout.seeds(0), rollout.seeds(1)]
    for _, batch in played:
        rows = batch.prompts.shape[0]
        assert 2 <= rows <= 2 * rollout.max_calls  # one sample per model call
        context = tok.batch_decode(batch.context_prompts, skip_special_tokens=True)
        plain = tok.batch_decode(batch.prompts, skip_special_tokens=True)
        assert all(
            rollout.experience.strip()[:40] in c and rollout.experience.strip()[:40] not in p
            for c, p in zip(context, plain)
        )
    logs = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert len(logs) == 2
    for key in ("rollout/win_rate", "rollout/invalid_action_rate", "rollout/mean_steps", "nca_loss"):
        assert key in logs[0], key
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_rollout_batch_must_match_episodes(tmp_path):
    tok = make_tiny_tokenizer()
    rollout = GameRollout(game="frozenlake", episodes_per_step=3)
    with pytest.raises(ValueError, match="episodes per step.*= 2"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            args=run_args(NCAConfig, tmp_path, ROLLOUT_RUN, max_new_tokens=6),
            processing_class=tok,
            rollout=rollout,
        )
