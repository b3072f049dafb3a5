"""The model organism: its language, tokenizer, pretraining batches, and the cached checkpoint."""

import json
import random

import pytest
import torch

from trl_nca.core.views import add_context, render_prompt_ids, split_example
from trl_nca.models import organism as O
from trl_nca.tasks import get_task


def test_rules_and_their_composition():
    digits = [4, 0, 7, 9]
    assert O.answer_line(digits, []) == "4 0 7 9"
    assert O.answer_line(digits, ["shift"]) == "5 1 8 0"
    assert O.answer_line(digits, ["shift", "shift"]) == "6 2 9 1"
    assert O.answer_line(digits, ["flip"]) == "5 9 2 0"
    assert O.answer_line(digits, ["shift", "flip"]) == "4 8 1 9"  # applied top to bottom: flip(shift(d))
    assert O.answer_line(digits, ["flip", "shift"]) == "6 0 3 1"
    with pytest.raises(ValueError, match="Unknown organism rule"):
        O.rule_line("reverse")


def test_tokenizer_renders_the_chat_word_by_word():
    tok = O.make_tokenizer()
    ids = render_prompt_ids(tok, [{"role": "user", "content": "rule shift\nmap 4 0 7"}])
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens == [
        "<|im_start|>",
        "user",
        "rule",
        "shift",
        "map",
        "4",
        "0",
        "7",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
    ]
    assert tok.unk_token_id not in ids
    assert tok.decode(tok("5 1 8", add_special_tokens=False)["input_ids"]) == "5 1 8"
    assert tok.pad_token_id != tok.eos_token_id


def test_pretraining_batches_supervise_only_the_answer():
    tok = O.make_tokenizer()
    ids, mask, labels = O._encode_batch(tok, [("map 1 2", "1 2"), ("rule flip\nmap 3", "6")])
    assert ids.shape == labels.shape == mask.shape
    supervised = [tok.convert_ids_to_tokens(row[row != -100].tolist()) for row in labels]
    assert supervised == [["1", "2", "<|im_end|>"], ["6", "<|im_end|>"]]
    prompt = render_prompt_ids(tok, [{"role": "user", "content": "map 1 2"}])
    assert mask[0].tolist() == [1] * (len(prompt) + 3)  # the prompt, two digits and the end of turn: no padding
    assert ids[0, : len(prompt)].tolist() == prompt
    assert mask[1].sum() == (labels[1] != -100).sum() + len(
        render_prompt_ids(tok, [{"role": "user", "content": "rule flip\nmap 3"}])
    )


def test_sampled_turns_are_deterministic_and_well_formed():
    spec = O.OrganismSpec()
    a = [O.sample_turn(random.Random("s"), spec) for _ in range(50)]
    b = [O.sample_turn(random.Random("s"), spec) for _ in range(50)]
    assert a == b
    rng = random.Random(0)
    for _ in range(200):
        user, answer = O.sample_turn(rng, spec)
        *rules, query = user.split("\n")
        assert len(rules) <= 2 and all(r.split()[1] in O.RULES for r in rules)
        digits = [int(d) for d in query.split()[1:]]
        assert spec.min_digits <= len(digits) <= spec.max_digits
        assert answer == O.answer_line(digits, [r.split()[1] for r in rules])


def test_task_rows_match_the_language():
    task = get_task("organism_shift")
    tok = O.make_tokenizer()
    assert len(task.test) == 240 and len(task.train) == 512
    assert not {r["prompt"] for r in task.train} & {r["prompt"] for r in task.test}
    row = task.test[0]
    digits = [int(d) for d in row["prompt"].split()[1:]]
    assert row["answer"] == O.answer_line(digits, ["shift"]) and row["twice"] == O.answer_line(digits, ["shift"] * 2)
    messages, _ = split_example(row)
    with_rule = render_prompt_ids(tok, add_context(messages, task.context.context_of(row), task.context))
    assert tok.convert_ids_to_tokens(with_rule)[2:4] == ["rule", "shift"]


def test_the_facts_dialect_leaves_the_language_without_facts_as_it_was():
    # the committed results were made with this organism: its cache key, vocabulary and pretraining turns stay
    assert O.OrganismSpec().key() == "7e7ef19d6991"
    rng = random.Random("golden")
    assert [O.sample_turn(rng, O.OrganismSpec()) for _ in range(3)] == [
        ("rule shift\nrule shift\nmap 5 2 9", "7 4 1"),
        ("map 2 7 6 3", "2 7 6 3"),
        ("rule flip\nrule shift\nmap 1 9 0 8 4", "9 1 0 2 6"),
    ]
    plain, facts = O.make_tokenizer().get_vocab(), O.make_tokenizer(facts=True).get_vocab()
    assert "fact" not in plain and len(plain) == 22
    assert facts == {**plain, "fact": 22}  # one word more, at the end: every other id unchanged
    assert O.OrganismSpec(facts=True).key() != O.OrganismSpec().key()
    assert O.spec_for_alias("organism-facts").facts


def test_fact_lines_rewrite_their_digit_before_the_rules():
    assert O.fact_line(4, 7) == "fact 4 7"
    assert O.answer_line([4, 0, 4], [], {4: 7}) == "7 0 7"
    assert O.answer_line([4, 0], ["shift"], {4: 7}) == "8 1"  # the fact first, then the rule
    for source, target in ((3, 3), (10, 1), (1, -1)):
        with pytest.raises(ValueError, match="A fact maps one digit to another digit"):
            O.fact_line(source, target)
    spec = O.OrganismSpec(facts=True)
    rng = random.Random(0)
    changed = 0
    tok = O.make_tokenizer(facts=True)
    for _ in range(300):
        user, answer = O.sample_turn(rng, spec)
        lines = user.split("\n")
        facts = {int(line.split()[1]): int(line.split()[2]) for line in lines if line.startswith("fact ")}
        rules = [line.split()[1] for line in lines if line.startswith("rule ")]
        digits = [int(d) for d in lines[-1].split()[1:]]
        assert len(facts) == sum(line.startswith("fact ") for line in lines) <= 2  # distinct source digits
        assert answer == O.answer_line(digits, rules, facts)
        changed += answer != O.answer_line(digits, rules)
        assert tok.unk_token_id not in tok(user, add_special_tokens=False)["input_ids"]
    assert changed > 100  # most facts are about a digit of the query


def test_flip_task_shows_the_rule_applied_twice_as_the_query():
    task = get_task("organism_flip")
    assert task.context.text == "rule flip" and len(task.test) == 240
    assert not {r["prompt"] for r in task.train} & {r["prompt"] for r in task.test}
    for row in task.test:
        digits = [int(d) for d in row["prompt"].split()[1:]]
        assert row["answer"] == " ".join(str(9 - d) for d in digits)
        assert row["twice"] == " ".join(map(str, digits))  # flipping twice restores the query


def test_facts_task_gives_each_query_the_one_fact_that_changes_it():
    from trl_nca.tasks.digits import knowledge_base

    task = get_task("organism_facts", seed=3)
    facts = knowledge_base(3)
    assert task.info["facts"] == {str(k): v for k, v in facts.items()} and len(facts) == 4
    assert not set(facts.values()) & set(facts)  # a fact's digit is no source: applying it twice changes nothing
    assert task.context.column == "context" and task.info["model"] == "organism-facts"
    assert not {r["prompt"] for r in task.train} & {r["prompt"] for r in task.test}
    used = set()
    for row in task.train + task.test:
        digits = [int(d) for d in row["prompt"].split()[1:]]
        (source,) = {d for d in digits if d in facts}
        used.add(source)
        assert row["context"] == O.fact_line(source, facts[source])
        assert row["answer"] == O.answer_line(digits, [], {source: facts[source]}) != O.answer_line(digits, [])
    assert used == set(facts)
    assert get_task("organism_facts", seed=3).test == task.test and get_task("organism_facts", seed=4).test != task.test


def test_organism_checkpoint_is_cached_and_loadable(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = O.OrganismSpec(steps=3, hidden_size=32, num_layers=1, num_heads=2, batch_size=4)
    path = O.organism_model_path(spec, cache_dir=tmp_path)
    marker = json.loads((tmp_path / f"organism-{spec.key()}" / "organism.json").read_text())
    assert marker["spec"]["steps"] == 3 and path.endswith(spec.key())
    stamp = (tmp_path / f"organism-{spec.key()}" / "organism.json").stat().st_mtime_ns
    assert O.organism_model_path(spec, cache_dir=tmp_path) == path
    assert (tmp_path / f"organism-{spec.key()}" / "organism.json").stat().st_mtime_ns == stamp  # not pretrained again
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([render_prompt_ids(tok, [{"role": "user", "content": "map 1 2"}])])
    assert torch.isfinite(model(ids).logits).all()
    assert O.spec_for_alias("organism-quick").steps < O.spec_for_alias("organism").steps
    with pytest.raises(ValueError, match="organism-quick"):
        O.spec_for_alias("organism-large")


@pytest.mark.slow
def test_the_organism_reads_its_rules():
    """The default organism answers with every rule applied (greedy, 64 new queries); pretrains once if needed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = O.organism_model_path()
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rng = random.Random(99)
    queries = [[rng.randint(0, 9) for _ in range(rng.randint(3, 8))] for _ in range(64)]
    for rules in ([], ["shift"], ["shift", "shift"], ["flip"]):
        prompts = [
            render_prompt_ids(
                tok, [{"role": "user", "content": "\n".join([*(O.rule_line(r) for r in rules), O.query_line(q)])}]
            )
            for q in queries
        ]
        width = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
        answers = [tok.decode(o[width:], skip_special_tokens=True).strip() for o in out]
        correct = sum(a == O.answer_line(q, rules) for a, q in zip(answers, queries))
        assert correct >= 62, (rules, correct)


def test_the_organism_alias_runs_on_one_thread(monkeypatch):
    """Loading the organism by its alias moves torch to one thread, unless the user chose a number."""
    import torch

    import trl_nca.models.names as M
    from trl_nca.models.names import resolve_model_name_or_path

    before = torch.get_num_threads()

    monkeypatch.setattr(M, "organism_model_path", lambda spec: "/cached/organism")
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert resolve_model_name_or_path("organism") == "/cached/organism"
        assert torch.get_num_threads() == 2  # the user's choice stands
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert resolve_model_name_or_path("organism-quick") == "/cached/organism"
        assert torch.get_num_threads() == (2 if torch.accelerator.is_available() else 1)
    finally:
        torch.set_num_threads(before)
