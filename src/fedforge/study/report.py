"""``fedforge report``: one self-contained HTML page of a run or a comparison folder.

The page carries everything inline (figures as base64 PNG, no scripts, styles or fonts from
elsewhere), so it can be mailed, archived or opened offline: the resolved configs, the
partition statistics (client sizes and a label-by-client heatmap), the curves, the per-client
distributions and the final table, ranked on the metric the methods are judged by.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from fedforge.experiment.metrics import TEST_METRIC, evaluated
from fedforge.experiment.partition_stats import partition_summary
from fedforge.experiment.rundir import write_text
from fedforge.study.client_plots import client_spreads, ecdf_figure, per_client_column
from fedforge.study.cluster_table import cluster_table
from fedforge.study.compare import format_cell, summary
from fedforge.study.judged import comparison_metric, table_metrics
from fedforge.study.labels import axis_label, metric
from fedforge.study.plots import (
    Run,
    draw,
    figure_options,
    figure_title,
    group_runs,
    load_run,
    metric_keys,
    named_order,
    set_title,
)

PARTITION_COLOR = "0.35"  # grey: no method's colour, which would suggest a method
CURVES = (("test_accuracy", "round"), ("test_loss", "round"), ("train_loss", "round"),
          ("test_accuracy", "sim_time_s"), ("test_accuracy", "bytes_up"))
_STYLE = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;
color:#222}h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.3em .6em;
text-align:right}th{background:#f2f2f2}td:first-child{text-align:left}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}img{width:100%}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.5em}
.note{color:#555;font-size:.9em}"""


def find_runs(folder: Path) -> list[Path]:
    """``folder`` itself if it is a run, else every run folder below it (``compare --out``:
    ``<algorithm>/`` or ``<algorithm>/seed<s>/``), in a stable order."""
    folder = Path(folder)
    if (folder / "metrics.jsonl").is_file():
        return [folder]
    found = sorted(p.parent for p in folder.glob("*/metrics.jsonl"))
    found += sorted(p.parent for p in folder.glob("*/*/metrics.jsonl"))
    if not found:
        raise FileNotFoundError(f"{folder}: no metrics.jsonl in it or in its subfolders "
                                "(expected a run folder or a compare --out folder)")
    return found


def write_report(folder: str | Path, out: str | Path | None = None, bands: str | None = None,
                 legend: str | None = None, metric: str | None = None) -> Path:
    """Write the page for ``folder`` (default ``folder/report.html``) -> its path.

    ``bands`` and ``legend`` style the curves as in ``fedforge plot``
    (:class:`fedforge.study.plots.FigureOptions`); ``metric``: the one the page ranks
    and draws first (default: what the methods are judged by)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    target = folder / "report.html" if out is None else Path(out)
    with figure_options(bands, legend):
        page = render(folder, metric)
    return write_text(target.parent, target.name, page)


def render(folder: Path, metric_key: str | None = None) -> str:
    """The HTML page of ``folder`` as text, ranked on ``metric_key`` (default: what the
    methods are judged by)."""
    runs = named_order([load_run(d) for d in find_runs(folder)])
    main = comparison_metric(runs) if metric_key is None else metric_key
    if metric_key is not None and metric_key not in metric_keys(runs):
        raise ValueError(f"--metric {metric_key!r}: not in the metrics files; available: "
                         f"{', '.join(metric_keys(runs))}")
    subtitle = figure_title(runs)
    title = f"fedforge report: {folder.resolve().name}"
    body = [f"<h1>{_e(title)}</h1>",
            f"<p>{_e(subtitle)}</p>" if subtitle else "",
            f'<p class="note">{len(runs)} run folder(s) under {_e(str(folder))}; methods '
            f"ranked on {_e(metric(main).described)}</p>",
            "<h2>Final results</h2>", _table(folder, runs, main),
            "<h2>Curves</h2>", _curves(runs, main),
            "<h2>Per-client results</h2>", _clients(runs, main, subtitle),
            _clusters(runs),
            "<h2>Partition</h2>", _partition(runs),
            "<h2>Configuration</h2>", _configs(folder, runs)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(b for b in body if b) + "\n</body></html>\n")


def _e(text: object) -> str:
    return html.escape(str(text))


def _png(fig, alt: str = "figure") -> str:
    """An ``<img>`` holding the figure as a base64 PNG, ``alt`` saying what it shows;
    closes the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(folder: Path, runs: list[Run], main: str = TEST_METRIC) -> str:
    """``table.json`` of a comparison, else one row per method from the runs' last
    evaluated records (a run still training may have later rounds without test metrics):
    the ranked metric ``main`` and the pooled test accuracy first."""
    path = folder / "table.json"
    if path.is_file():
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
    else:
        rows = []
        for label, group in group_runs(runs).items():
            lasts = [evals[-1] for r in group if (evals := evaluated(r.records))]
            if not lasts:
                continue
            row: dict = {"algorithm": label, "seeds": len(lasts)}
            for key in (*table_metrics(main), "test_loss", "sim_time_s", "bytes_up"):
                values = [e[key] for e in lasts if isinstance(e.get(key), (int, float))]
                if values:
                    row[f"final {key}"] = summary(values)
            rows.append(row)
    if not rows:
        return "<p>No evaluated round yet.</p>"
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a list of row objects")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{_e(_col(c))}</th>" for c in cols)
    lines = ["".join(f"<td>{_e(_cell(path, i, r, c))}</td>" for c in cols)
             for i, r in enumerate(rows)]
    return (f'<table id="final"><tr>{head}</tr>'
            + "".join(f"<tr>{line}</tr>" for line in lines) + "</table>"
            '<p class="note">mean ± half the 95 % t-interval over seeds (a paired difference: '
            "over the pairs its \"paired by\" column names); (k/m): only k of m seeds "
            "reached the target</p>")


def _cell(path: Path, i: int, row: dict, col: str) -> str:
    """One formatted cell; a value of the wrong shape (a hand-edited or hostile
    ``table.json``) is a ValueError naming the file, row and column."""
    try:
        return format_cell(row.get(col), row.get("seeds"))
    except (TypeError, ValueError, KeyError, AttributeError):
        raise ValueError(f"{path}: row {i + 1}, column {col!r}: expected a number, a text or "
                         "a {mean, std, n, ci_low, ci_high} summary") from None


def _col(key: str) -> str:
    """A column header that says which model on which data a number comes from."""
    if key.startswith("final ") and " " not in key[6:]:
        return f"final {metric(key[6:]).described}"
    return key if key in ("algorithm", "method", "seeds") else metric(key).described


def _curves(runs: list[Run], main: str = TEST_METRIC) -> str:
    keys = {k for run in runs for r in run.records for k in r}
    parts = []
    first = [(main, "round")] if main != TEST_METRIC else []
    for y, x in dict.fromkeys([*first, *CURVES]):
        if y in keys and x in keys:
            fig, data = draw(runs, y, x, logx=x == "bytes_up")
            panels = ", one panel per method" if data["bands"] == "panels" else ""
            parts.append(_png(fig, f"{axis_label(y)} against {axis_label(x)}{panels}"))
    if not parts:
        return "<p>No evaluated round yet.</p>"
    return '<div class="figs">' + "\n".join(parts) + "</div>"


def _clients(runs: list[Run], main: str, title: str) -> str:
    """Each method's per-client distribution at its last evaluated round (an ECDF) and a
    table of its worst clients, from the runs' ``client_metrics.npz``."""
    column = per_client_column(main)
    spreads = client_spreads(runs, column)
    if not spreads:
        return ("<p>No per-client results (client_metrics.npz: written by the personalised "
                "evaluation, eval.personal = true).</p>")
    about = metric(column).described
    fig = ecdf_figure(spreads, column, title)
    head = "".join(f"<th>{h}</th>" for h in (
        "method", "clients", "mean", "10th percentile", "worst client", "mean of the worst 10 %"))
    lines = []
    for s in spreads:
        got = s.summary()
        cells = [s.method, f"{int(got['clients'])}"] + [
            f"{got[k]:.4f}" for k in ("mean", "p10", "worst", "worst10_mean")]
        lines.append("".join(f"<td>{_e(c)}</td>" for c in cells))
    return (f'<p class="note">{_e(about)}; last evaluated round, seeds pooled</p>'
            + f'<div class="figs">{_png(fig, f"per-client distribution of {about}")}</div>'
            + f'<table id="clients"><tr>{head}</tr>'
            + "".join(f"<tr>{line}</tr>" for line in lines) + "</table>")


def _clusters(runs: list[Run]) -> str:
    """A clustered method's clients per cluster over the rounds ('' when no run has any)."""
    tables = [cluster_table(f"{run.algorithm} ({run.path.name})", run.records) for run in runs]
    tables = [t for t in tables if t]
    return "<h2>Clusters</h2>" + "\n".join(tables) if tables else ""


def _partition(runs: list[Run]) -> str:
    """Every distinct partition of the runs (each seed draws its own): a line of numbers,
    the client sizes and the label-by-client heatmap of each."""
    groups = _distinct_partitions(runs)
    if not groups:
        return "<p>No partition.json (runs from before it was recorded).</p>"
    items = "".join(f"<li>{_e(label)}: {_e(part.get('dataset', ''))}, "
                    f"{_e(partition_summary(part))} (from {_e(group[0].path)})</li>"
                    for label, part, group in groups)
    figs = [_png(_sizes_figure(groups), "client sizes")]
    if all(part.get("label_counts") and part["label_counts"][0] for _, part, _ in groups):
        figs.append(_png(_heatmap_figure(groups), "training samples per label and client"))
        note = ""
    else:
        note = ('<p class="note">No label histogram (next-token task: the labels are the '
                "vocabulary).</p>")
    return (f'<ul id="partitions">{items}</ul><div class="figs">{"".join(figs)}</div>{note}')


def _distinct_partitions(runs: list[Run]) -> list[tuple[str, dict, list[Run]]]:
    """(label, partition, runs) per distinct ``partition.json``, labelled by the seeds
    that drew it (methods of one comparison share a seed's partition)."""
    found: dict[str, tuple[dict, list[Run]]] = {}
    for run in runs:
        if run.partition:
            part = _checked_partition(run)
            found.setdefault(json.dumps(part, sort_keys=True), (part, []))[1].append(run)
    return [(_seeds_label(group), part, group) for part, group in found.values()]


def _seeds_label(group: list[Run]) -> str:
    seeds = sorted({r.seed for r in group if isinstance(r.seed, int)})
    if not seeds:
        return group[0].path.name
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _sizes_figure(groups: list[tuple[str, dict, list[Run]]]):
    """Client sizes, one row per partition, on shared axes."""
    n = len(groups)
    fig, axes = plt.subplots(n, 1, figsize=(6.4, 1.2 + 1.4 * n), dpi=120, sharex=True,
                             sharey=True, squeeze=False, layout="constrained")
    for ax, (label, part, _) in zip(axes.flat, groups):
        ax.bar(range(len(part["sizes"])), part["sizes"], color=PARTITION_COLOR, width=1.0)
        ax.set_title(label, fontsize="small", loc="left")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # clients are numbered
    fig.supxlabel("client", fontsize="medium")
    fig.supylabel("training samples", fontsize="medium")
    set_title(fig, "client sizes")
    return fig


def _heatmap_figure(groups: list[tuple[str, dict, list[Run]]]):
    """Training samples per label and client, one panel per partition, one colour scale."""
    arrays = [np.asarray(part["label_counts"], dtype=float).T for _, part, _ in groups]
    ncols = min(3, len(groups))
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 if ncols == 1 else 3.0 * ncols + 0.8,
                                                    0.8 + 2.6 * nrows), dpi=120,
                             squeeze=False, layout="constrained")
    vmax = max(float(a.max()) for a in arrays) or 1.0
    for i, ax in enumerate(axes.flat):
        if i >= len(groups):
            ax.set_visible(False)
            continue
        im = ax.imshow(arrays[i], aspect="auto", cmap="viridis", interpolation="nearest",
                       vmin=0.0, vmax=vmax)
        ax.set_title(groups[i][0], fontsize="small", loc="left")
        for axis in (ax.xaxis, ax.yaxis):  # clients and labels are numbered
            axis.set_major_locator(MaxNLocator(integer=True))
    fig.supxlabel("client", fontsize="medium")
    fig.supylabel("label", fontsize="medium")
    fig.colorbar(im, ax=axes, label="samples")
    set_title(fig, "training samples per label and client")
    return fig


def _checked_partition(run: Run) -> dict:
    """``run.partition`` once its numbers are numbers (it comes from the run folder: a
    hand-edited ``partition.json`` is a ValueError naming the file, not a traceback)."""
    part, path = run.partition, run.path / "partition.json"
    sizes, counts = part.get("sizes"), part.get("label_counts")
    if not isinstance(sizes, list) or not all(_count(s) for s in sizes):
        raise ValueError(f"{path}: \"sizes\" must be a list of non-negative integers")
    if not _count(part.get("num_clients", len(sizes))):
        raise ValueError(f"{path}: \"num_clients\" must be a non-negative integer")
    if counts is not None and not (
            isinstance(counts, list) and all(isinstance(c, list) for c in counts)
            and len({len(c) for c in counts}) <= 1 and all(_count(v) for c in counts for v in c)):
        raise ValueError(f"{path}: \"label_counts\" must be a list of equally long lists of "
                         "non-negative integers")
    return part


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _configs(folder: Path, runs: list[Run]) -> str:
    parts = []
    for label, group in group_runs(runs).items():
        path = group[0].path / "config.resolved.toml"
        text = path.read_text(encoding="utf-8") if path.is_file() else "(no config.resolved.toml)"
        seeds = sorted({r.seed for r in group if r.seed is not None})
        note = f" (seeds {', '.join(map(str, seeds))}; shown: seed {group[0].seed})" \
            if len(seeds) > 1 else ""
        parts.append(f"<details{' open' if len(runs) == 1 else ''}><summary>{_e(label)}"
                     f"{_e(note)}</summary><pre>{_e(text)}</pre></details>")
    return "\n".join(parts)
