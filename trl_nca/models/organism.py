"""A model organism for context distillation: a tiny chat model pretrained here, in a few minutes, on a synthetic
language in which the context changes the answer.

The language. A user turn holds zero or more rule lines followed by a query; the assistant answers the query with
every rule applied:

    user:       rule shift          <- the context (zero, one or two rule lines)
                map 4 0 7 1         <- the prompt
    assistant:  5 1 8 2             <- the query with every rule applied, top to bottom

Two rules exist: `shift` adds one to every digit (9 becomes 0) and `flip` maps every digit d to 9 - d. Pretraining
mixes turns with no rule (the answer copies the query), one rule and two rules (applied in order, so `shift` twice
adds two), and the model learns to read rules from its context and to compose them. Distilling the context
`rule shift` into the weights then asks the student to shift when no rule is given. Whether it still answers right
when the rule is given back, or applies it twice (adds two), is exactly the question the paper asks, with a correct
and a "twice-applied" answer that can both be scored exactly.

A second, opt-in dialect adds **facts** (`OrganismSpec(facts=True)`, alias `organism-facts`): a line `fact 4 7` says
that the digit 4 is written as 7 in the answer (before any rule is applied). Facts are per-item knowledge: each
query of the `organism_facts` task comes with the one fact that changes its answer, from a small knowledge base fixed
by the task's seed. The default organism does not know the word `fact`, so its vocabulary, weights and cache key are
those of the language without facts.

`organism_model_path()` pretrains once (seeded, deterministic on a given machine) into a cache folder holding a
normal Transformers checkpoint (Llama architecture, word-level tokenizer with a ChatML template), so every part of
trl-nca (trainer, evaluation, reports) runs on it unchanged. The alias `organism` works wherever a model name does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..console import progress_bar
from ..inputs import default_cache_dir
from . import shipped


logger = logging.getLogger(__name__)

# "organism-quick": a shorter pretraining, for smoke runs and CI; "organism-facts": the dialect with fact lines
ORGANISM_ALIASES = ("organism", "organism-quick", "organism-facts")
SPECIAL_TOKENS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>")
RULES = {"shift": lambda d: (d + 1) % 10, "flip": lambda d: 9 - d}
WORDS = ("system", "user", "assistant", "rule", "map", *RULES)
DIGITS = tuple(str(d) for d in range(10))
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class OrganismSpec:
    """Everything that determines the pretrained organism; its hash names the cache folder."""

    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    min_digits: int = 3
    max_digits: int = 8
    rule_counts: tuple[float, float, float] = (0.35, 0.4, 0.25)  # probability of 0, 1 and 2 rule lines
    steps: int = 1000
    batch_size: int = 64
    learning_rate: float = 2e-3
    facts: bool = False  # the dialect with fact lines (`fact 4 7`)
    fact_counts: tuple[float, float, float] = (0.4, 0.45, 0.15)  # probability of 0, 1 and 2 fact lines (facts only)

    def key(self) -> str:
        fields = asdict(self)
        if not self.facts:  # the language without facts keeps the cache key it had before the dialect existed
            del fields["facts"], fields["fact_counts"]
        text = json.dumps({**fields, "format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def rule_line(rule: str) -> str:
    """The context line of one rule."""
    if rule not in RULES:
        raise ValueError(f"Unknown organism rule {rule!r}; the language has {sorted(RULES)}.")
    return f"rule {rule}"


def fact_line(source: int, target: int) -> str:
    """The context line of one fact: the digit `source` is written as `target`."""
    if not (0 <= source <= 9 and 0 <= target <= 9) or source == target:
        raise ValueError(f"A fact maps one digit to another digit, not {source!r} to {target!r}.")
    return f"fact {source} {target}"


def query_line(digits: list[int]) -> str:
    return "map " + " ".join(str(d) for d in digits)


def apply_rules(digits: list[int], rules: list[str]) -> list[int]:
    for rule in rules:
        digits = [RULES[rule](d) for d in digits]
    return digits


def apply_facts(digits: list[int], facts: dict[int, int]) -> list[int]:
    return [facts.get(d, d) for d in digits]


def answer_line(digits: list[int], rules: list[str], facts: dict[int, int] | None = None) -> str:
    """The correct answer to `query_line(digits)` under the fact lines `facts` (source digit -> written digit, applied
    first) and the rule lines `rules` (then, in order)."""
    return " ".join(str(d) for d in apply_rules(apply_facts(digits, facts or {}), rules))


def make_tokenizer(facts: bool = False):
    """A word-level tokenizer over the language's words and digits plus the ChatML specials (pad, eos `<|im_end|>`);
    `facts` adds the word `fact` (at the end, so every other token keeps its id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *WORDS, *DIGITS, *(("fact",) if facts else ())))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        unk_token="<|unk|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def make_model(tokenizer, spec: OrganismSpec):
    """A randomly initialised Llama for the language."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=3 * spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads // 2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def sample_turn(rng: random.Random, spec: OrganismSpec) -> tuple[str, str]:
    """One pretraining (user message, assistant answer) pair."""
    count = rng.choices((0, 1, 2), weights=spec.rule_counts)[0]
    rules = [rng.choice(sorted(RULES)) for _ in range(count)]
    digits = [rng.randint(0, 9) for _ in range(rng.randint(spec.min_digits, spec.max_digits))]
    facts: dict[int, int] = {}
    if spec.facts:
        # mostly facts about a digit of the query (they change the answer), sometimes about another digit (no change)
        for _ in range(rng.choices((0, 1, 2), weights=spec.fact_counts)[0]):
            free = [d for d in range(10) if d not in facts]
            present = [d for d in free if d in digits]
            source = rng.choice(present if present and rng.random() < 0.85 else free)
            facts[source] = rng.choice([d for d in range(10) if d != source])
    lines = [*(fact_line(s, t) for s, t in facts.items()), *(rule_line(r) for r in rules), query_line(digits)]
    return "\n".join(lines), answer_line(digits, rules, facts)


def _encode_batch(tokenizer, pairs: list[tuple[str, str]]):
    """Right-padded input ids and labels (-100 outside the assistant's answer and its end-of-turn token)."""
    import torch

    from ..core.views import render_prompt_ids

    rows, labels = [], []
    for user, answer in pairs:
        prompt = render_prompt_ids(tokenizer, [{"role": "user", "content": user}])
        completion = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(list(prompt) + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return ids, mask, target


def pretrain(spec: OrganismSpec, progress: bool = True):
    """Train the organism from scratch on freshly sampled turns; returns (model, tokenizer, final loss)."""
    import torch

    tokenizer = make_tokenizer(spec.facts)
    model = make_model(tokenizer, spec)
    rng = random.Random(f"organism:{spec.seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, spec.learning_rate, total_steps=spec.steps, pct_start=0.1)
    model.train()
    bar = None
    if progress:
        bar = progress_bar(spec.steps, "pretraining the organism", "step")
    loss_value = float("nan")
    for _ in range(spec.steps):
        ids, mask, target = _encode_batch(tokenizer, [sample_turn(rng, spec) for _ in range(spec.batch_size)])
        loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    return model, tokenizer, loss_value


def spec_for_alias(alias: str) -> OrganismSpec:
    """The organism an alias names: `organism` (the default spec), `organism-quick` (300 pretraining steps: it
    follows the rules less reliably, but is ready in a fraction of the time; for smoke runs and CI) or
    `organism-facts` (the dialect with fact lines, pretrained for 1500 steps)."""
    alias = alias.strip().lower()
    if alias not in ORGANISM_ALIASES:
        raise ValueError(f"Unknown organism alias {alias!r}; choose one of {ORGANISM_ALIASES}.")
    if alias == "organism-facts":
        return OrganismSpec(facts=True, steps=1500)
    return OrganismSpec(steps=300) if alias == "organism-quick" else OrganismSpec()


DIALECTS = ("rules", "facts")


def shipped_spec(dialect: str, seed: int) -> OrganismSpec:
    """The spec of a shipped organism: `rules` is the default organism (`organism`; tasks `organism_shift` and
    `organism_flip`), `facts` the dialect with fact lines (`organism-facts`; task `organism_facts`), with `seed`."""
    if dialect not in DIALECTS:
        raise ValueError(f"Unknown organism dialect {dialect!r}; choose one of {DIALECTS}.")

    return replace(spec_for_alias("organism" if dialect == "rules" else "organism-facts"), seed=seed)


SHIPPED_NAME = re.compile(r"organism-(rules|facts)-s(\d+)")


def shipped_name(spec: OrganismSpec) -> str | None:
    """The name of a shipped organism's spec (`organism-rules-s2`, the name of its weights file and a model name every
    command takes), or None for another spec."""
    for dialect in DIALECTS:
        if spec == shipped_spec(dialect, spec.seed):
            return f"organism-{dialect}-s{spec.seed}"
    return None


def spec_for_name(name: str) -> OrganismSpec | None:
    """The organism a model name names: an alias (`spec_for_alias`) or a shipped organism's name (`shipped_name`);
    None for any other name."""
    name = name.strip().lower()
    if name in ORGANISM_ALIASES:
        return spec_for_alias(name)
    matched = SHIPPED_NAME.fullmatch(name)
    return shipped_spec(matched.group(1), int(matched.group(2))) if matched else None


def build_shipped(spec: OrganismSpec, out_dir: str | os.PathLike | None = None) -> dict:
    """Pretrain `spec` on this machine, store its weights in float16 in the shipped folder (or `out_dir`) and list
    them in its manifest; returns the manifest entry. `scripts/build_organisms.py` calls this."""
    import torch
    from safetensors.torch import save

    dialect = "facts" if spec.facts else "rules"
    if spec != shipped_spec(dialect, spec.seed):
        raise ValueError(f"Only the default spec of each dialect ships, with another seed; not {spec}.")
    start = time.perf_counter()
    model, _, loss = pretrain(spec, progress=False)
    state = {name: tensor.detach().to(torch.float16).contiguous() for name, tensor in model.state_dict().items()}
    name = f"organism-{dialect}-s{spec.seed}"
    folder = Path(out_dir) if out_dir is not None else shipped.RESOURCE_DIR
    shipped._write_atomically(folder / f"{name}.safetensors", save(state, metadata={"spec": json.dumps(asdict(spec))}))
    entry = {
        "file": f"{name}.safetensors",
        "key": spec.key(),
        "spec": asdict(spec),
        "dtype": shipped.SHIPPED_DTYPE,
        "sha256": shipped.file_sha256(folder / f"{name}.safetensors"),
        "weights_digest": shipped.weights_digest(state),
        "final_loss": round(loss, 6),
        "seconds": round(time.perf_counter() - start, 1),
        "built_on": {"machine": shipped.cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    manifest = shipped.read_manifest(folder)
    manifest.setdefault("organisms", {})[name] = entry
    manifest["format"] = FORMAT_VERSION
    shipped.write_manifest(manifest, folder)
    return entry


def _cached_matches(target: Path, entry: dict) -> bool:
    from safetensors.torch import load_file

    weights = target / "model.safetensors"
    return weights.is_file() and shipped.weights_digest(load_file(str(weights))) == entry["weights_digest"]


def _materialise_shipped(spec: OrganismSpec, entry: dict, target: Path) -> None:
    """Write the shipped organism `entry` as a normal float32 checkpoint into `target` (replacing what is there)."""
    state = shipped.load_reference(entry)
    tokenizer = make_tokenizer(spec.facts)
    model = make_model(tokenizer, spec)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"The shipped organism {entry['file']} does not fit its spec: missing {missing}, "
            f"unexpected {unexpected}. Rebuild it with scripts/build_organisms.py."
        )
    model.eval()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        marker = {
            "spec": asdict(spec),
            "format": FORMAT_VERSION,
            "final_loss": entry["final_loss"],
            "shipped": entry["file"],
            "sha256": entry["sha256"],
        }
        (staging / "organism.json").write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:  # another process finished first; it wrote the same shipped weights
            if not _cached_matches(target, entry):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def use_one_cpu_thread() -> bool:
    """Run torch on one CPU thread, unless `OMP_NUM_THREADS` is set or an accelerator is present; True if it did.

    The organism's matrices are tiny, so on a CPU a second thread costs more in synchronisation than it gains: 40
    pretraining steps took 14-16 s on one thread and 120-221 s on two, side by side on the 2-core development machine
    while other jobs ran. Every command that loads the organism by its alias calls this.
    """
    import torch

    if "OMP_NUM_THREADS" in os.environ or torch.accelerator.is_available() or torch.get_num_threads() == 1:
        return False
    torch.set_num_threads(1)
    logger.info("The model organism runs on one CPU thread (set OMP_NUM_THREADS to choose another number).")
    return True


def _sigterm_exits():
    """Make SIGTERM raise `SystemExit` (exit status 143) instead of ending the process on the spot, so `finally`
    clauses run; only in the main thread and where SIGTERM has its default action. Returns what puts it back."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return lambda: None

    def exit_143(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_143)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def organism_model_path(spec: OrganismSpec | None = None, cache_dir: str | os.PathLike | None = None) -> str:
    """The folder of the pretrained organism, pretraining it first if this machine has not yet (a few minutes)."""
    spec = spec or OrganismSpec()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / f"organism-{spec.key()}"
    entry = shipped.entry_for_key(spec.key())
    if entry is not None:  # a shipped organism: the cache holds exactly its weights, or is rebuilt from them
        if (target / "organism.json").is_file() and _cached_matches(target, entry):
            return str(target)
        if target.exists():
            logger.warning(
                "The cached organism %s differs from the shipped %s; rebuilding it from the shipped weights.",
                target,
                entry["file"],
            )
        root.mkdir(parents=True, exist_ok=True)
        _materialise_shipped(spec, entry, target)
        return str(target)
    if (target / "organism.json").is_file():
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    restore_sigterm = _sigterm_exits()  # a SIGTERM (a scheduler, `kill`) still removes the staging folder below
    staging = Path(tempfile.mkdtemp(prefix=f".organism-{spec.key()}.tmp-", dir=root))
    try:
        logger.warning("Pretraining the model organism (one time, a few minutes on a CPU) into %s.", target)
        start = time.perf_counter()
        model, tokenizer, loss = pretrain(spec)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        marker = {
            "spec": asdict(spec),
            "format": FORMAT_VERSION,
            "final_loss": loss,
            "seconds": round(time.perf_counter() - start, 1),
        }
        (staging / "organism.json").write_text(json.dumps(marker, indent=2) + "\n")  # written last
        try:
            staging.rename(target)
        except OSError:  # another process finished first; its copy is identical
            if not (target / "organism.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        restore_sigterm()
    return str(target)
