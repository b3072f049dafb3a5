"""MkDocs hooks of the documentation site (mkdocs.yml: `hooks`), and the generators they run.

Generated at build time from the code, so the pages cannot drift from it:

- `docs/reference/cli.md`: every `<!-- cli: COMMAND -->` marker becomes the output of `trl-nca COMMAND --help`
  (`<!-- cli: -->` is `trl-nca --help`).
- `docs/reference/troubleshooting.md`: every `<!-- errors: MODULE ... -->` marker becomes the list of the error
  messages raised in those modules (read from the source with `ast`). Every module that raises must be claimed by
  one marker, and every quoted message fragment on the page (a definition-list term in backticks) must occur in a
  message of the code: otherwise the build fails.
- `docs/results.md`: its figures (git-ignored, drawn by `docs/results/build.py`) are drawn when missing.
- `docs/quickstart.md`: `<!-- quickstart: report -->` and `<!-- quickstart: figures -->` become the main table and
  the figures of a real quickstart report, from its `summary.json` kept in `docs/quickstart/` (figures git-ignored).
- `<!-- include: PATH -->` inserts a repository file (e.g. `examples/accelerate/README.md`); links in every page that
  point at repository files outside `docs/` are rewritten to the site page that shows them (`SITE_PAGES`).

    python scripts/docs_hooks.py errors   # print the extracted error messages (module, line, class, message)
    python scripts/docs_hooks.py cli      # print the CLI reference's help texts
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import html
import importlib.util
import io
import os
import posixpath
import re
import sys
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_nca"
DOCS = ROOT / "docs"
# Repository files outside docs/ that the site shows, and the page that shows them.
SITE_PAGES = {"examples/accelerate/README.md": "launch-configs.md"}
CLI_MARKER = re.compile(r"<!-- cli: ?([\w-]*) -->")
ERRORS_MARKER = re.compile(r"<!-- errors: ([^>]+?) -->")
INCLUDE_MARKER = re.compile(r"<!-- include: (\S+) -->")
# A quoted message fragment: a definition-list term that is one code span (`...`, or ``...`` around a fragment
# holding backticks), followed by its definition.
FRAGMENT = re.compile(r"^(`+) ?(.+?) ?\1\n(?=:   )", re.M)
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


# ----------------------------------------------------------------------------------------------------------- CLI


def command_help(command: str, columns: int = 110) -> str:
    """What `trl-nca COMMAND --help` prints (`trl-nca --help` for an empty command), at a fixed width."""
    from trl_nca.cli import main

    argv = [command, "--help"] if command else ["--help"]
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)  # argparse wraps to $COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(argv)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    text = out.getvalue().strip("\n")
    if not text:
        raise RuntimeError(f"`trl-nca {' '.join(argv)}` printed nothing.")
    return text


def render_cli(markdown: str) -> str:
    def replace(match: re.Match) -> str:
        command = match.group(1)
        return f"```text\n$ trl-nca {(command + ' ') if command else ''}--help\n{command_help(command)}\n```"

    return CLI_MARKER.sub(replace, markdown)


# -------------------------------------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class ErrorSite:
    """One place in the package that raises an error (or returns one to be raised, or stops argparse)."""

    module: str
    line: int
    function: str
    kind: str  # the exception class, or "usage error" for argparse's parser.error
    message: str | None  # the message with `{expression}` for formatted parts; None: not a literal

    @property
    def where(self) -> str:
        return f"{self.module}.{self.function}" if self.function else self.module


def _literal(node: ast.AST) -> str | None:
    """The text of a string literal, f-string (formatted parts as `{expression}`) or concatenation of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(value.value)
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        if left is not None and right is not None:
            return left + right
        if left is not None or right is not None:
            return (left or "{...}") + (right or "{...}")
    return None


def _is_error_name(name: str) -> bool:
    return name.endswith(("Error", "Exception")) or name in ("StopIteration", "NotImplemented")


def _call_name(node: ast.AST) -> str:
    return ast.unparse(node.func) if isinstance(node, ast.Call) else ast.unparse(node)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _scopes(tree: ast.AST) -> dict[ast.AST, str]:
    """The dotted name of the function or class each node of `tree` is in ("" at module level)."""
    scopes: dict[ast.AST, str] = {}
    stack = [(tree, "")]
    while stack:
        node, scope = stack.pop()
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{scope}.{child.name}" if scope else child.name
            scopes[child] = inner
            stack.append((child, inner))
    return scopes


def error_sites(package: Path = PACKAGE) -> list[ErrorSite]:
    """Every `raise X(...)`, `return XError(...)` and `parser.error(...)` in the package, in source order."""
    sites = []
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = _scopes(tree)
        for node in ast.walk(tree):
            scope = scopes.get(node, "")
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc
                if not isinstance(exc, ast.Call):
                    continue  # a re-raise of a caught error, or of an exception class without a message
                kind = _call_name(exc).rsplit(".", 1)[-1]
                message = _literal(exc.args[0]) if exc.args else None
                if message is None and not exc.args:
                    message = ""
                sites.append(ErrorSite(module, node.lineno, scope, kind, message))
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                kind = _call_name(node.value).rsplit(".", 1)[-1]
                if _is_error_name(kind) and node.value.args:
                    sites.append(ErrorSite(module, node.lineno, scope, kind, _literal(node.value.args[0])))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "error"
                and ast.unparse(node.func.value).endswith("parser")
                and node.args
            ):
                sites.append(ErrorSite(module, node.lineno, scope, "usage error", _literal(node.args[0])))
    return sorted(sites, key=lambda s: (s.module, s.line))


def _claimed(module: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)


def _message_html(site: ErrorSite) -> str:
    if site.message is None:
        return "<em>the message of the error it wraps (the original error's text, passed on unchanged)</em>"
    if site.message == "":
        return "<em>no message</em>"
    return html.escape(site.message).replace("\n", "<br>")


def render_error_table(sites: list[ErrorSite]) -> str:
    rows = "\n".join(
        f"<tr><td><code>{html.escape(s.kind)}</code></td><td>{_message_html(s)}</td>"
        f"<td><code>{html.escape(s.where)}</code><br>line {s.line}</td></tr>"
        for s in sites
    )
    return (
        '<table class="error-table">\n<thead><tr><th>error</th><th>message (<code>{...}</code>: filled in at run '
        "time)</th><th>raised in</th></tr></thead>\n<tbody>\n" + rows + "\n</tbody>\n</table>"
    )


def render_troubleshooting(markdown: str, sites: list[ErrorSite] | None = None) -> str:
    """The page with every errors marker replaced by its modules' messages. Fails (RuntimeError) if a module that
    raises is claimed by no marker, a marker claims nothing, or a quoted fragment occurs in no message."""
    sites = error_sites() if sites is None else sites
    groups = [match.group(1).split() for match in ERRORS_MARKER.finditer(markdown)]
    problems = []
    for module in sorted({s.module for s in sites}):
        owners = [g for g in groups if _claimed(module, g)]
        if len(owners) != 1:
            problems.append(f"module {module} raises errors and is claimed by {len(owners)} error groups, not 1")
    for group in groups:
        if not any(_claimed(s.module, group) for s in sites):
            problems.append(f"the error group {' '.join(group)!r} claims no module that raises")
    messages = [s.message for s in sites if s.message]
    for _, fragment in FRAGMENT.findall(markdown):
        if not any(fragment in message for message in messages):
            problems.append(f"the quoted message fragment {fragment!r} occurs in no error message of the code")
    if problems:
        raise RuntimeError(
            "docs/reference/troubleshooting.md is out of step with the code:\n- " + "\n- ".join(problems)
        )

    def replace(match: re.Match) -> str:
        patterns = match.group(1).split()
        return render_error_table([s for s in sites if _claimed(s.module, patterns)])

    return ERRORS_MARKER.sub(replace, markdown)


# --------------------------------------------------------------------------------------------- includes and links


def rewrite_links(markdown: str, source: str, page: str) -> str:
    """Make the relative links of `markdown` (written as if it lived at repository path `source`) work from the site
    page `page` (a path under docs/): links to files under docs/ become relative to the page, links to the files
    of `SITE_PAGES` point at their page; every other link is left alone (and so checked by mkdocs)."""
    source_dir = posixpath.dirname(source)
    page_dir = posixpath.dirname(page)

    def replace(match: re.Match) -> str:
        start, target, anchor, end = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("/"):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join(source_dir, target))
        if resolved in SITE_PAGES:
            resolved = "docs/" + SITE_PAGES[resolved]
        if not resolved.startswith("docs/"):
            return match.group(0)
        relative = posixpath.relpath(resolved[len("docs/") :], page_dir or ".")
        return f"{start}{relative}{anchor or ''}{end}"

    return LINK.sub(replace, markdown)


def render_includes(markdown: str, page: str) -> str:
    def replace(match: re.Match) -> str:
        source = match.group(1)
        text = (ROOT / source).read_text(encoding="utf-8")
        text = re.sub(r"\A# .*\n", "", text)  # the page has its own title
        return rewrite_links(text, source, page)

    return INCLUDE_MARKER.sub(replace, markdown)


# ---------------------------------------------------------------------------------------------- results figures


def _results_build():
    spec = importlib.util.spec_from_file_location("docs_results_build", DOCS / "results" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def missing_figures() -> list[str]:
    page = (DOCS / "results.md").read_text(encoding="utf-8")
    return [p for p in re.findall(r"!\[[^\]]*\]\((results/figures/[^)]+)\)", page) if not (DOCS / p).is_file()]


# ----------------------------------------------------------------------------------------------- quickstart report

QUICKSTART = DOCS / "quickstart" / "summary.json"  # the summary.json of a real quickstart run
QUICKSTART_FIGURES = {"accuracy": "plot_accuracy", "harm_help": "plot_harm_help"}
QUICKSTART_MARKER = re.compile(r"<!-- quickstart: (report|figures) -->")


def draw_quickstart_figures() -> None:
    """Draw the quickstart report's figures from its summary, with the functions `trl-nca eval` draws them with."""
    import json

    from trl_nca.eval import plots

    summary = json.loads(QUICKSTART.read_text(encoding="utf-8"))
    folder = DOCS / "quickstart" / "figures"
    folder.mkdir(exist_ok=True)
    for name, function in QUICKSTART_FIGURES.items():
        if not (folder / f"{name}.png").is_file():
            getattr(plots, function)(summary, folder / f"{name}.png")


def render_quickstart(markdown: str) -> str:
    """`<!-- quickstart: report -->`: the report's main table and notes, as `trl-nca eval` renders them;
    `<!-- quickstart: figures -->`: its figures."""
    import json

    from trl_nca.eval import render_markdown

    def replace(match: re.Match) -> str:
        if match.group(1) == "figures":
            return "\n\n".join(f"![{name}](quickstart/figures/{name}.png)" for name in QUICKSTART_FIGURES)
        report = render_markdown(json.loads(QUICKSTART.read_text(encoding="utf-8")))
        body = report.split("\n## ", 1)[0]  # the title line, the legend, the main table and its notes
        return re.sub(r"\A# .*\n", "", body).strip()

    return QUICKSTART_MARKER.sub(replace, markdown)


# -------------------------------------------------------------------------------------------------------- hooks


def on_pre_build(config, **kwargs) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # document and run this checkout's trl_nca
    if missing_figures():  # git-ignored; drawn from docs/results/data by docs/results/build.py
        _results_build().draw_all()
        if missing_figures():
            raise RuntimeError(f"docs/results/build.py did not draw {missing_figures()}")
    draw_quickstart_figures()


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    path = page.file.src_uri
    markdown = render_includes(markdown, path)
    markdown = rewrite_links(markdown, "docs/" + path, path)
    if CLI_MARKER.search(markdown):
        markdown = render_cli(markdown)
    if QUICKSTART_MARKER.search(markdown):
        markdown = render_quickstart(markdown)
    if ERRORS_MARKER.search(markdown):
        markdown = render_troubleshooting(markdown)
    return markdown


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    what = sys.argv[1] if len(sys.argv) > 1 else "errors"
    if what == "errors":
        for site in error_sites():
            print(f"{site.module}:{site.line}\t{site.kind}\t{site.where}\t{site.message!r}")
    elif what == "cli":
        for command in ("", "train", "eval", "compare", "analyze", "experience"):
            print(command_help(command), end="\n\n")
    else:
        raise SystemExit(f"unknown argument {what!r}: use errors or cli")
