"""Batched rollouts: one generate call per step, aligned samples, the two views, statistics and the seed schedule."""

import pytest

from trl_nca.core.sampling import Generated, HFBackend, generate_fn
from trl_nca.core.views import add_context, render_prompt_ids
from trl_nca.envs import (
    FrozenLakeEnv,
    GameRollout,
    default_game_spec,
    game_generation_settings,
    load_experience,
    make_env,
    play_episodes,
    solve,
    training_seeds,
)
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer, scripted_generate


@pytest.fixture(scope="module")
def tiny():
    tokenizer = make_tiny_tokenizer()
    return tokenizer, make_tiny_model(tokenizer, seed=0)


class Recorder:
    """Wraps a generate function and keeps every batch of prompts it got and of completions it returned."""

    def __init__(self, generate):
        self.generate = generate
        self.prompts, self.outputs = [], []

    def __call__(self, prompts, seeds):
        out = self.generate(prompts, seeds)
        self.prompts.append(prompts)
        self.outputs.append(out)
        return out


def lake_oracle_move(prompt_text):
    """The first move of a shortest solution from the last 3x3 lake board shown in a prompt."""
    rows = [line for line in prompt_text.splitlines() if line.startswith("|")][-3:]
    layout = ["".join(cell.strip() or "." for cell in row.strip("|").split("|")) for row in rows]
    return solve(FrozenLakeEnv.from_layout(layout))[0]


def test_rollout_batch_on_tiny_model_gives_aligned_samples(tiny):
    tokenizer, model = tiny
    experience = load_experience("frozenlake")
    spec = default_game_spec()
    envs = GameRollout("frozenlake", episodes_per_step=4).make_envs(0)
    settings = game_generation_settings(max_new_tokens=6, batch_size=8)
    generate = Recorder(generate_fn(HFBackend(model, tokenizer), settings))
    result = play_episodes(envs, generate, tokenizer, experience, spec, max_calls=5)

    sizes = [len(batch) for batch in generate.prompts]
    assert sizes[0] == 4 and sizes == sorted(sizes, reverse=True) and len(sizes) <= 5  # one call per step
    assert len(result.samples) == sum(sizes) == result.stats["num_calls"]
    generated = [g.token_ids for batch in generate.outputs for g in batch]
    assert [s["completion_ids"] for s in result.samples] == generated  # exactly as generated, in call order
    views = [p for batch in generate.prompts for p in batch]
    for sample, view in zip(result.samples, views):
        prompt = sample["prompt"]
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        assert experience not in prompt[0]["content"]  # the prompt has no context
        assert sample["context"] == experience
        # the context view is what was generated from, and differs from the prompt only by the experience
        assert render_prompt_ids(tokenizer, add_context(prompt, experience, spec)) == view
        joined = [{"role": "user", "content": experience + "\n\n" + prompt[0]["content"]}]
        assert render_prompt_ids(tokenizer, joined) == view
        assert envs[sample["episode"]].seed == sample["seed"]
    steps = {}
    for sample in result.samples:
        steps.setdefault(sample["episode"], []).append(sample["step"])
    assert all(v == list(range(len(v))) for v in steps.values()) and sorted(steps) == [0, 1, 2, 3]
    assert all(env.done for env in envs)
    stats = result.stats
    assert len(stats["episodes"]) == 4 and 1 <= stats["mean_steps"] <= 5
    assert 0 <= stats["win_rate"] <= 1 and 0 <= stats["invalid_action_rate"] <= 1
    assert set(result.metrics(prefix="game/")) >= {"game/win_rate", "game/invalid_action_rate", "game/mean_steps"}


def test_student_plays_without_context_but_samples_carry_the_experience(tiny):
    tokenizer, _ = tiny
    rollout = GameRollout("sokoban", episodes_per_step=3)
    generate = Recorder(scripted_generate(tokenizer, lambda prompt: "[up]"))
    result = rollout.play(0, generate, tokenizer)
    assert all(rollout.experience not in tokenizer.decode(p) for batch in generate.prompts for p in batch)
    assert all(s["context"] == rollout.experience for s in result.samples)
    assert [s["seed"] for s in result.samples[:3]] == training_seeds(3, round=0)


def test_scripted_policies_give_the_expected_statistics(tiny):
    tokenizer, _ = tiny
    lakes = [make_env("frozenlake", s) for s in training_seeds(5)]
    result = play_episodes(
        lakes,
        scripted_generate(tokenizer, lambda prompt: f"go [{lake_oracle_move(prompt)}]"),
        tokenizer,
        None,
        default_game_spec(),
    )
    assert result.stats["win_rate"] == 1.0 and result.stats["invalid_action_rate"] == 0.0
    assert result.stats["mean_steps"] == 4.0 and result.stats["cap_rate"] == 0.0

    lakes = [make_env("frozenlake", s) for s in training_seeds(5)]
    result = play_episodes(
        lakes, scripted_generate(tokenizer, lambda prompt: "hmm"), tokenizer, None, default_game_spec()
    )
    assert result.stats["win_rate"] == 0.0 and result.stats["invalid_action_rate"] == 1.0
    assert result.stats["mean_steps"] == 2.0  # two invalid replies in a row end each game
    assert {e["end_reason"] for e in result.stats["episodes"]} == {"invalid_moves"}

    rooms = [make_env("sokoban", s) for s in training_seeds(3)]
    moves = iter(["[left]", "[right]"] * 20)
    result = play_episodes(rooms, scripted_generate(tokenizer, lambda prompt: next(moves)), tokenizer, None, None, 3)
    assert all(env.num_calls <= 3 for env in rooms) and all(env.done for env in rooms)


def test_bad_generate_output_and_reused_envs_raise():
    tokenizer = make_tiny_tokenizer()
    envs = [make_env("frozenlake", 1), make_env("frozenlake", 2)]
    one = Generated([1], "", False)
    with pytest.raises(ValueError, match="one Generated per prompt: sent 2, got 1"):
        play_episodes(envs, lambda prompts, seeds: [one], tokenizer, None, default_game_spec())
    with pytest.raises(TypeError, match="Generated` objects, got list"):
        play_episodes(envs, lambda prompts, seeds: [[1]] * len(prompts), tokenizer, None, default_game_spec())
    envs = [make_env("frozenlake", 1), make_env("frozenlake", 2)]
    envs[0].step("right")
    with pytest.raises(ValueError, match="fresh environments"):
        play_episodes(envs, lambda prompts, seeds: [one] * len(prompts), tokenizer, None, default_game_spec())


def test_game_rollout_seed_schedule_and_settings():
    rollout = GameRollout("frozenlake", env_kwargs={"size": 4, "num_holes": 3}, episodes_per_step=2)
    assert rollout.seeds(0) == training_seeds(2, round=0)
    assert rollout.seeds(3) == training_seeds(2, round=3)
    envs = rollout.make_envs(1)
    assert [e.seed for e in envs] == training_seeds(2, round=1) and all(e.size == 4 for e in envs)
    assert GameRollout("sokoban", seed_round_offset=5).seeds(0) == training_seeds(8, round=5)
    assert GameRollout("sokoban", experience="my hints").experience == "my hints"
    with pytest.raises(ValueError, match="max_calls"):
        GameRollout("sokoban", env_kwargs={"max_calls": 3})
    with pytest.raises(TypeError, match="settings"):
        GameRollout("sokoban", env_kwargs={"holes": 3})
    with pytest.raises(ValueError, match="Unknown game"):
        GameRollout("tetris")
