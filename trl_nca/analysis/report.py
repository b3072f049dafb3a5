"""Writing an analysis: `analysis.json` (everything), `report.md` (a summary), and PNG figures drawn from the JSON
alone with matplotlib's Agg canvas (pyplot's backend is left alone)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..eval.plots import figures_wanted, new_figure
from ..inputs import atomic_output, write_text_atomic


def plot_hidden_cosine(result: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Per-layer hidden-state cosine between the views: the token mean (solid) and the low percentile (dashed)."""
    figure = new_figure(7.5, 4.2)
    ax = figure.add_subplot(1, 1, 1)
    percentile = result["settings"]["options"]["percentile"]
    for index, model in enumerate(result["models"]):
        cos = model["hidden_cosine"]
        color = f"C{index % 10}"
        ax.plot(cos["layers"], cos["mean"], marker="o", markersize=3, color=color, label=f"{model['name']} (mean)")
        ax.plot(cos["layers"], cos["percentile"], linestyle="--", color=color, alpha=0.7, label=f"p{percentile:g}")
    ax.set_xlabel("decoder layer (its output)")
    _integer_ticks(ax.xaxis)
    ax.set_ylabel("cosine(h_x, h_c) on completion tokens")
    ax.set_title("Hidden states with vs without the context, layer by layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    with atomic_output(path) as temporary:
        figure.savefig(temporary)
    return str(path)


def plot_view_kl(result: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Mean KL(q_x || q_c) at each completion position, one line per model."""
    figure = new_figure(7.5, 3.8)
    ax = figure.add_subplot(1, 1, 1)
    for index, model in enumerate(result["models"]):
        points = model["view_kl"]["by_position"]
        ax.plot(
            [p["position"] for p in points], [p["mean"] for p in points], color=f"C{index % 10}", label=model["name"]
        )
    ax.set_xlabel("completion position")
    _integer_ticks(ax.xaxis)
    ax.set_ylabel("mean KL(q_x || q_c) (nats)")
    ax.set_title("How much the context changes the next-token distribution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    with atomic_output(path) as temporary:
        figure.savefig(temporary)
    return str(path)


def plot_update_norms(result: Mapping[str, Any], path: str | os.PathLike) -> str | None:
    """Heat maps of ||dW|| / ||W|| by layer (rows) and module type (columns), one per student."""
    students = [m for m in result["models"] if m.get("update")]
    if not students:
        return None
    figure = new_figure(3.2 * len(students) + 1.6, 5.0)
    finite = [v for m in students for row in m["update"]["relative"] for v in row if v is not None and math.isfinite(v)]
    top = max(finite, default=0.0) or 1e-12  # one colour scale for every student, so the maps compare
    axes = []
    for index, model in enumerate(students):
        update = model["update"]
        ax = figure.add_subplot(1, len(students), index + 1)
        axes.append(ax)
        values = [[math.nan if v is None else v for v in row] for row in update["relative"]]
        image = ax.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0, vmax=top)
        ax.set_xticks(range(len(update["modules"])))
        ax.set_xticklabels(update["modules"], rotation=60, ha="right", fontsize=7)
        step = max(1, len(update["layers"]) // 12)
        ax.set_yticks(range(0, len(update["layers"]), step))
        ax.set_yticklabels(update["layers"][::step], fontsize=7)
        ax.set_ylabel("decoder layer")
        ax.set_title(f"{model['name']} ({update['method']})", fontsize=9)
    figure.suptitle("Relative update ||W_student - W_base|| / ||W_base||", fontsize=10)
    figure.tight_layout()
    figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    with atomic_output(path) as temporary:
        figure.savefig(temporary)
    return str(path)


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 1e5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}"
    return str(value)


def _cell(text: str) -> str:
    """A token or text shown inside a Markdown table cell."""
    return "`" + json.dumps(text, ensure_ascii=False)[1:-1].replace("|", "\\|").replace("`", "'") + "`"


def markdown(result: Mapping[str, Any]) -> str:
    """The summary report."""
    models = result["models"]
    lines = _summary_section(result)
    lines += _cosine_section(models, result["settings"]["options"]["percentile"])
    lines += _top_token_section(models)
    lines += _gradient_section(models)
    lines += _update_section(models)
    notes = result.get("notes") or []
    if notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in notes] + [""]
    figures = result.get("files", {}).get("figures", {})
    if figures:
        lines += ["## Figures", ""] + [f"![{k}]({Path(v).name})" for k, v in figures.items()] + [""]
    lines += [
        "How each number is measured: see docs/analysis.md (tokens: the positions that predict the completion "
        "tokens, the same tokens in both views; cosine per token, then mean and percentile over tokens; KL at the "
        "logit temperature; relative Frobenius norms).",
        "",
    ]
    return "\n".join(lines)


def _summary_section(result: Mapping[str, Any]) -> list[str]:
    settings = result["settings"]
    options = settings["options"]
    p = f"p{options['percentile']:g}"
    lines = [f"# {settings.get('title') or 'What distilling the context did inside the models'}", ""]
    lines += [
        f"Data: {settings['data']}. Completions: {settings['completions']}.",
        f"Context placement: {settings['context']['placement']}. Logit temperature: {options['temperature']:g}.",
        "",
        "## Summary",
        "",
        f"| model | tokens | lowest layer-mean cosine (layer) | lowest {p} | mean view KL (nats/token) "
        "| OPD-NCA grad cosine | total update |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model in result["models"]:
        cos = model["hidden_cosine"]
        means = [m for m in cos["mean"] if not math.isnan(m)]
        low = min(range(len(cos["mean"])), key=lambda i: cos["mean"][i]) if means else None
        lowest = f"{_fmt(cos['mean'][low])} ({cos['layers'][low]})" if low is not None else "n/a"
        grad = model.get("grad_cosine", {}).get("cosine")
        update = model.get("update", {}).get("total") if model.get("update") else None
        lines.append(
            f"| {model['name']} | {model['tokens']} | {lowest} | {_fmt(min(cos['percentile'], default=math.nan))} | "
            f"{_fmt(model['view_kl']['token_mean'])} | {_fmt(grad)} | {_fmt(update)} |"
        )
    return lines


def _cosine_section(models: Sequence[Mapping[str, Any]], percentile: float) -> list[str]:
    p = f"p{percentile:g}"
    lines = ["", "## Hidden-state cosine per layer (token mean)", ""]
    layers = models[0]["hidden_cosine"]["layers"]
    lines.append("| layer | " + " | ".join(f"{m['name']} mean | {m['name']} {p}" for m in models) + " |")
    lines.append("| --- |" + " --- | --- |" * len(models))
    for i, layer in enumerate(layers):
        cells = []
        for m in models:
            cos = m["hidden_cosine"]
            cells += [_fmt(cos["mean"][i]), _fmt(cos["percentile"][i])] if i < len(cos["mean"]) else ["n/a", "n/a"]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def _top_token_section(models: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["", "## Where the context changes the distribution most", ""]
    for model in models:
        top = model["view_kl"]["top_tokens"]
        if not top:
            continue
        lines += [
            f"**{model['name']}** (completion token y_t; each view's probability of it and its own most likely token)",
            "",
            "| item | position | KL | y_t | q_x(y_t) | q_c(y_t) | top of q_x | top of q_c |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for t in top:
            lines.append(
                f"| {_cell(t['item_id'])} | {t['position']} | {_fmt(t['kl'], 3)} | {_cell(t['token'])} | "
                f"{_fmt(math.exp(t['logp_x']), 3)} | {_fmt(math.exp(t['logp_c']), 3)} | "
                f"{_cell(t['top_x'])} ({_fmt(math.exp(t['top_x_logp']), 2)}) | "
                f"{_cell(t['top_c'])} ({_fmt(math.exp(t['top_c_logp']), 2)}) |"
            )
        lines.append("")
    return lines


def _gradient_section(models: Sequence[Mapping[str, Any]]) -> list[str]:
    grads = [m for m in models if m.get("grad_cosine")]
    if not grads:
        return []
    lines = [
        "## OPD vs NCA gradients",
        "",
        "| model | cosine | norm OPD | norm NCA | OPD loss | NCA loss | parameters | items | tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in grads:
        g = m["grad_cosine"]
        lines.append(
            f"| {m['name']} | {_fmt(g['cosine'])} | {_fmt(g['norm_opd'])} | {_fmt(g['norm_nca'])} | "
            f"{_fmt(g['opd_loss'])} | {_fmt(g['nca_loss'])} | {g['num_params']} | {g['items']} | {g['tokens']} |"
        )
    lines.append("")
    return lines


def _update_section(models: Sequence[Mapping[str, Any]]) -> list[str]:
    students = [m for m in models if m.get("update")]
    if not students:
        return []
    modules = list(dict.fromkeys(mod for m in students for mod in m["update"]["modules"]))
    lines = [
        "## Update by module type (||dW|| / ||W||, all layers together)",
        "",
        "| model | method | " + " | ".join(modules) + " | total |",
        "| --- | --- |" + " --- |" * (len(modules) + 1),
    ]
    for m in students:
        by = m["update"]["by_module"]
        lines.append(
            f"| {m['name']} | {m['update']['method']} | "
            + " | ".join(_fmt(by.get(mod)) for mod in modules)
            + f" | {_fmt(m['update']['total'])} |"
        )
    lines += ["", "Update by layer (all module types together):", ""]
    lines.append("| layer | " + " | ".join(m["name"] for m in students) + " |")
    lines.append("| --- |" + " --- |" * len(students))
    layer_ids = students[0]["update"]["layers"]
    for i, layer in enumerate(layer_ids):
        lines.append(f"| {layer} | " + " | ".join(_fmt(m["update"]["by_layer"][i]) for m in students) + " |")
    lines.append("")
    return lines


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_analysis(result: dict[str, Any], output_dir: str | os.PathLike, plots: bool | None = None) -> dict[str, Any]:
    """Write `analysis.json`, `report.md` and (with `plots`) `hidden_cosine.png`, `view_kl.png`, `update_norms.png`
    into `output_dir`; returns the paths. NaN (undefined) values are written as JSON null. `plots=None` draws the
    figures when matplotlib is installed and otherwise skips them with one logged line."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, str] = {}
    if figures_wanted(plots, output_dir):
        figures["hidden_cosine"] = plot_hidden_cosine(result, output_dir / "hidden_cosine.png")
        figures["view_kl"] = plot_view_kl(result, output_dir / "view_kl.png")
        heat = plot_update_norms(result, output_dir / "update_norms.png")
        if heat:
            figures["update_norms"] = heat
    files = {
        "json": str(output_dir / "analysis.json"),
        "markdown": str(output_dir / "report.md"),
        "figures": figures,
    }
    result["files"] = files
    write_text_atomic(output_dir / "report.md", markdown(result))
    write_text_atomic(output_dir / "analysis.json", json.dumps(_json_safe(result), indent=2, ensure_ascii=False) + "\n")
    return files
