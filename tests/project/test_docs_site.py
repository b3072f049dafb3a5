"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, the code of its pages parses,
the tutorials' marked blocks run as written (on a tiny model instead of the embedded one), and the generated pages
(CLI reference, troubleshooting) cover the code."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trl_nca.testing import load_script


ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A fenced block: its language, the rest of the fence line (e.g. title="x.yaml"), its body; and whether the line
# before it is the `<!-- test: run -->` marker.
FENCE = re.compile(
    r"(?P<marker><!-- test: run -->\n)?^```(?P<lang>\w*)(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S
)
# Tutorial pages whose marked blocks run, in order; a page runs the pages it reads files from first.
TUTORIALS = ["system-prompt.md", "evaluate.md", "games.md", "experience.md", "from-gkd.md"]
REQUIRES = {"evaluate.md": ["system-prompt.md"]}


def _hooks():
    return load_script(ROOT / "scripts" / "docs_hooks.py")


def _blocks(path: Path) -> list[dict]:
    return [dict(m.groupdict(), marker=bool(m.group("marker"))) for m in FENCE.finditer(path.read_text("utf-8"))]


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


# ------------------------------------------------------------------------------------------------- the site build


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' (the dev extra includes it)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env["NO_MKDOCS_2_WARNING"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    site = tmp_path / "site"
    for page in ("index.html", "api/trainer/index.html", "reference/troubleshooting/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "losses" / "index.html").read_text("utf-8")
    assert 'id="trl_nca.core.losses.token_divergences"' in api  # mkdocstrings rendered the docstrings
    from trl_nca import NCAConfig, NCADistillationConfig

    for page, config_class in (("config", NCAConfig), ("distillation", NCADistillationConfig)):
        html = (site / "api" / page / "index.html").read_text("utf-8")  # the docstring as the class has it at run time
        for name in ("nca_beta", "share_prefix", config_class._support_size_name):
            assert html.count(name) > 1 and config_class.__dataclass_fields__[name].metadata["help"][:40] in html, name
    cli = (site / "reference" / "cli" / "index.html").read_text("utf-8")
    assert "usage: trl-nca train" in cli and "--nca_beta" in cli
    results = (site / "results" / "index.html").read_text("utf-8")
    for figure in re.findall(r'src="(results/figures/[^"]+)"', results):
        assert (site / "results" / figure).is_file(), figure


# ------------------------------------------------------------------------------------------------ the code blocks


def test_every_python_block_of_the_docs_parses():
    count = 0
    for path in _pages():
        for block in _blocks(path):
            if block["lang"] in ("python", "py"):
                count += 1
                try:
                    ast.parse(block["body"])
                except SyntaxError as error:
                    raise AssertionError(f"{path.relative_to(ROOT)}: a python block does not parse: {error}") from error
    assert count >= 15


def test_every_yaml_block_of_the_docs_parses():
    import yaml

    for path in _pages():
        for block in _blocks(path):
            if block["lang"] in ("yaml", "yml"):
                assert isinstance(yaml.safe_load(block["body"]), dict), path


@pytest.fixture(scope="module")
def tutorial_dir(tmp_path_factory):
    from trl_nca.testing import save_tiny_model

    root = tmp_path_factory.mktemp("tutorials")
    return {"dir": root / "work", "model": save_tiny_model(root / "tiny"), "done": set()}


def _run_tutorial(page: str, state: dict, monkeypatch) -> int:
    """Run the marked blocks of a tutorial in order, in one namespace, with the tiny model instead of `embedded`."""
    from trl_nca.cli import main

    for required in REQUIRES.get(page, []):
        if required not in state["done"]:
            _run_tutorial(required, state, monkeypatch)
    state["dir"].mkdir(exist_ok=True)
    monkeypatch.chdir(state["dir"])
    namespace = {"__name__": "__main__"}
    ran = 0
    for block in _blocks(DOCS / "tutorials" / page):
        if not block["marker"]:
            continue
        body = re.sub(r"\bembedded\b", state["model"], block["body"])
        if block["lang"] == "python":
            exec(compile(body, f"{page} block {ran}", "exec"), namespace)
        elif block["lang"] == "yaml":
            title = re.search(r'title="([^"]+)"', block["info"])
            assert title, f'{page}: a marked yaml block needs title="FILE" (the file it is saved as)'
            Path(title.group(1)).write_text(body, encoding="utf-8")
        elif block["lang"] == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip()
                if not line or line.startswith("#"):
                    continue
                words = shlex.split(line)
                assert words[0] == "trl-nca", f"{page}: marked bash blocks run trl-nca commands only, got {line!r}"
                assert main(words[1:]) == 0, line
        else:
            raise AssertionError(f"{page}: cannot run a marked {block['lang']!r} block")
        ran += 1
    state["done"].add(page)
    return ran


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_runs_as_written(page, tutorial_dir, monkeypatch):
    assert _run_tutorial(page, tutorial_dir, monkeypatch) >= 1, f"{page} has no block marked <!-- test: run -->"


def test_every_tutorial_with_runnable_code_is_run():
    for path in sorted((DOCS / "tutorials").glob("*.md")):
        if any(block["marker"] for block in _blocks(path)):
            assert path.name in TUTORIALS, f"{path.name} has marked blocks but is not in TUTORIALS"


# -------------------------------------------------------------------------------------------- the generated pages


def test_troubleshooting_lists_every_error_of_the_code():
    hooks = _hooks()
    sites = hooks.error_sites()
    assert len(sites) > 250  # every raise, returned error and parser.error in trl_nca
    page = (DOCS / "reference" / "troubleshooting.md").read_text("utf-8")
    rendered = hooks.render_troubleshooting(page, sites)
    for site in sites:  # each message appears, with the function that raises it
        assert f"<code>{site.where}</code><br>line {site.line}<" in rendered, site
    # The guards of the build: a module that no group claims, and a quoted message that the code does not raise.
    unclaimed = page.replace(" trl_nca.trainers.teacher ", " trl_nca.nothing ")
    with pytest.raises(RuntimeError, match="module trl_nca.trainers.teacher raises errors and is claimed by 0"):
        hooks.render_troubleshooting(unclaimed, sites)
    stale = page.replace("`is not UTF-8 text`", "`is not Latin-1 text`")
    with pytest.raises(RuntimeError, match="'is not Latin-1 text' occurs in no error message"):
        hooks.render_troubleshooting(stale, sites)


def test_error_extraction_reads_fstrings_returned_errors_and_parser_errors(tmp_path):
    hooks = _hooks()
    package = tmp_path / "trl_nca"
    package.mkdir()
    (package / "m.py").write_text(
        "def f(x, parser):\n"
        "    if x:\n"
        "        raise ValueError(f'bad {x!r}; fix it')\n"
        "    parser.error('--n must be positive')\n"
        "    return KeyError('missing ' + str(x))\n"
        "class C:\n"
        "    def g(self, error):\n"
        "        raise RuntimeError(str(error)) from error\n"
    )
    hooks.ROOT = tmp_path
    sites = hooks.error_sites(package)
    got = [(s.where, s.kind, s.message) for s in sites]
    assert got == [
        ("trl_nca.m.f", "ValueError", "bad {x}; fix it"),
        ("trl_nca.m.f", "usage error", "--n must be positive"),
        ("trl_nca.m.f", "KeyError", "missing {...}"),
        ("trl_nca.m.C.g", "RuntimeError", None),
    ]


def test_cli_reference_shows_every_command():
    hooks = _hooks()
    page = (DOCS / "reference" / "cli.md").read_text("utf-8")
    commands = re.findall(r"<!-- cli: ?([\w-]*) -->", page)
    usage = (ROOT / "trl_nca" / "cli" / "__init__.py").read_text("utf-8")
    listed = re.search(r"usage: trl-nca \{([\w,]+)\}", usage).group(1).split(",")
    assert sorted(c for c in commands if c) == sorted(listed)
    rendered = hooks.render_cli(page.replace("<!-- cli: train -->", ""))  # train's parser is slow to build: below
    for command in listed:
        if command != "train":
            assert f"usage: trl-nca {command}" in rendered, command
    assert "--nca_beta" in hooks.command_help("train")


def test_links_to_repository_files_point_at_their_site_pages():
    hooks = _hooks()
    # examples/accelerate/README.md, shown as the page launch-configs.md, links back into docs/
    included = hooks.rewrite_links(
        "see [d](../../docs/distributed.md#x)", "examples/accelerate/README.md", "launch-configs.md"
    )
    assert included == "see [d](distributed.md#x)"
    text = (
        "[l](../../examples/accelerate/README.md) [c](../concepts.md#a) [w](https://a.b/c.md) [o](../../pyproject.toml)"
    )
    out = hooks.rewrite_links(text, "docs/tutorials/x.md", "tutorials/x.md")
    # a file shown by a site page links to that page; docs links stay; others are left for mkdocs to report
    assert out == "[l](../launch-configs.md) [c](../concepts.md#a) [w](https://a.b/c.md) [o](../../pyproject.toml)"


# ---------------------------------------------------------------------------------------- paper to code, examples


def test_paper_to_code_names_the_shipped_configs_and_launch_commands():
    page = (DOCS / "paper-to-code.md").read_text("utf-8")
    configs = re.findall(r"`((?:medmcqa|safety|sokoban|frozenlake)-[\w.-]+-nca\.yaml)`", page)
    assert len(configs) == 12 and len(set(configs)) == 12
    reference = ROOT / "examples" / "configs" / "reference"
    for name in configs:
        assert (reference / name).is_file(), name
        assert (reference / name.replace("-nca.yaml", "-opd.yaml")).is_file(), name
    launches = (ROOT / "examples" / "accelerate" / "README.md").read_text("utf-8")
    commands = [line for line in page.splitlines() if line.startswith("$Z2 ")]
    assert commands == [line for line in launches.splitlines() if line.startswith("$Z2 ")]
    for line in commands:
        for word in line.split():
            if word.startswith("examples/"):
                assert (ROOT / word).is_file(), word


def test_every_example_path_named_in_the_docs_exists():
    for path in _pages():
        for name in re.findall(
            r"(?<![\w/])((?:examples|scripts|trl_nca|tests|benchmarks)/[\w./-]+\.(?:py|yaml|md|sh|txt))",
            path.read_text("utf-8"),
        ):
            assert (ROOT / name).exists(), f"{path.relative_to(ROOT)} names {name}, which does not exist"
