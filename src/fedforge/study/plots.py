"""Figures of run folders: mean over seeds with a 95 % t-interval band, one style per method.

matplotlib with the Agg backend (works headless). Every figure is written three times: a PNG,
a vector PDF beside it, and a JSON file with the plotted numbers (``<name>.json``: each curve's
x, mean, interval and number of seeds), so a figure can be checked or redrawn without the
runs. Runs are grouped by their resolved config without the seed; a group of several seeds is
drawn as its mean with the t-based 95 % interval of :mod:`fedforge.study.stats`.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedforge.experiment.partition_stats import load_partition_stats  # noqa: E402
from fedforge.experiment.rundir import save_figure, write_text  # noqa: E402
from fedforge.study.judged import comparison_metric  # noqa: E402
from fedforge.study.labels import axis_label, metric  # noqa: E402
from fedforge.study.stats import t_interval  # noqa: E402
from fedforge.study.styles import (  # noqa: E402
    BAND_STYLES,
    LEGEND_PLACES,
    LINESTYLES,
    MethodStyle,
    styles_for,
    wrap_to_width,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

logger = logging.getLogger(__name__)

BAND_ALPHA = 0.2
BAND_NOTE = "shaded: 95 % t-interval over seeds"
# sections that do not change what a run computes: runs differing only there (and in the
# seed) are seeds of one method
_NOT_METHOD = ("seed", "name", "rounds", "eval", "checkpoint", "engine", "compare", "logging",
               "max_updates", "max_time")


@dataclass
class Run:
    """One run folder's records, resolved config (``{}`` if none) and partition statistics."""

    path: Path
    records: list[dict]
    config: dict = field(default_factory=dict)
    partition: dict | None = None
    task: str | None = None  # multi-task runs are split into one Run per task

    @property
    def algorithm(self) -> str | None:
        algo = self.config.get("algorithm")
        name = (algo.get("name") if isinstance(algo, dict) else None) or self.config.get("method")
        return None if name is None else str(name)  # a hand-edited config may hold any type

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")


def load_run(run_dir: str | Path) -> Run:
    """``metrics.jsonl`` (required), ``config.resolved.toml`` and ``partition.json`` of a run."""
    d = Path(run_dir)
    path = d / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {d} a fedforge run directory?)")
    config = {}
    cfg_path = d / "config.resolved.toml"
    if cfg_path.is_file():
        try:
            config = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{cfg_path}: not valid TOML ({exc})") from None
    partition = load_partition_stats(d)
    if partition is not None and not isinstance(partition, dict):
        raise ValueError(f"{d / 'partition.json'}: expected a JSON object")
    return Run(d, read_metrics(path), config, partition)


def load_run_list(run_dirs: list[Path]) -> list[Run]:
    return [load_run(d) for d in run_dirs]


def load_runs(run_dirs: list[Path]) -> dict[str, list[dict]]:
    """``metrics.jsonl`` of each run directory, keyed by :func:`run_labels`.

    A half-written last line (a run still writing, or killed mid-write) is skipped with a
    warning; any other line that is not a JSON record is a ``ValueError`` naming the line.
    """
    runs = load_run_list(run_dirs)
    return dict(zip(run_labels(runs), (r.records for r in runs)))


def read_metrics(path: Path) -> list[dict]:
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    numbered = [(i, x) for i, x in enumerate(lines, 1) if x.strip()]
    records = []
    for i, line in numbered:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        elif i == numbered[-1][0]:
            logger.warning("%s: skipping the incomplete last line %d (run still writing?)",
                           path, i)
        else:
            raise ValueError(f"{path}: line {i} is not a JSON record; the file is damaged")
    return records


def run_labels(runs: list[Run]) -> list[str]:
    """``fedavg (seed 0)`` from the config; without one, the shortest path tail that tells the
    runs apart (``fedavg/seed0`` and ``scaffold/seed0``, not ``seed0`` twice)."""
    labels = []
    tails = _distinct_tails([r.path for r in runs])
    for run, tail in zip(runs, tails):
        if run.algorithm is None:
            label = tail
        else:
            label = run.algorithm if run.seed is None else f"{run.algorithm} (seed {run.seed})"
        labels.append(label if run.task is None else f"{label} / {run.task}")
    return _dedupe(labels, tails)


def _distinct_tails(paths: list[Path]) -> list[str]:
    parts = [Path(p).resolve().parts for p in paths]
    for k in range(1, max((len(p) for p in parts), default=1) + 1):
        tails = ["/".join(p[-k:]) for p in parts]
        if len(set(tails)) == len(set(map(tuple, parts))):
            return tails
    return ["/".join(p) for p in parts]


def _dedupe(labels: list[str], tails: list[str]) -> list[str]:
    """Labels that collide get the run's distinguishing path tail appended."""
    return [f"{lab} [{tail}]" if labels.count(lab) > 1 else lab
            for lab, tail in zip(labels, tails)]


def split_tasks(runs: list[Run]) -> list[Run]:
    """Multi-task runs (records with ``task``) become one Run per task."""
    out = []
    for run in runs:
        tasks = list(dict.fromkeys(r["task"] for r in run.records if "task" in r))
        if not tasks:
            out.append(run)
            continue
        for task in tasks:
            recs = [r for r in run.records if r.get("task") == task]
            out.append(Run(run.path, recs, run.config, run.partition, task))
    return out


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Seeds of one method together, labelled by algorithm (and task): configs that differ
    only in the seed or in settings that do not change the computation form one group."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in run.config.items() if k not in _NOT_METHOD},
                         sort_keys=True, default=str) if run.config else str(run.path)
        groups.setdefault(f"{key}|{run.task}", []).append(run)
    firsts = [g[0] for g in groups.values()]
    names = [(run.algorithm or tail) + ("" if run.task is None else f" / {run.task}")
             for run, tail in zip(firsts, _distinct_tails([r.path for r in firsts]))]
    parents = _distinct_tails([g[0].path.parent if len(g) > 1 else g[0].path
                               for g in groups.values()])
    return dict(zip(_dedupe(names, parents), groups.values()))


@dataclass
class Curve:
    """One drawn line: mean over ``n`` seeds per point, and its 95 % t-interval."""

    label: str
    x: list[float]
    mean: list[float]
    ci_low: list[float | None]
    ci_high: list[float | None]
    n: list[int]
    method: str = ""  # the group's name: what its colour and marker are keyed by


def curves(runs: list[Run], y: str, x: str = "round", average: bool = True) -> list[Curve]:
    """Each group's mean curve (``average``), or one curve per run labelled with its seed.

    Seeds are aligned by ``round`` (by evaluation index if records have none); a point is
    drawn where every seed of the group has it, at the mean of their ``x``."""
    out = []
    for label, group in group_runs(split_tasks(runs)).items():
        if average and len(group) > 1:
            members = [(f"{label} (mean of {len(group)} seeds)", group)]
        else:
            tails = _distinct_tails([r.path for r in group])
            members = [(f"{label} (seed {r.seed})" if r.seed is not None else
                        label if len(group) == 1 else f"{label} [{tail}]", [r])
                       for r, tail in zip(group, tails)]
        for name, rs in members:
            curve = _mean_curve(name, rs, y, x)
            curve.method = _method_key(label)
            if curve.x:
                out.append(curve)
    return out


def _method_key(label: str) -> str:
    """A group's label as a style key: ``fedavg [fedavg]`` (a compare folder named after
    its algorithm, beside a named variant) is ``fedavg``."""
    name, _, tail = label.partition(" [")
    return name if tail == f"{name}]" else label


def _mean_curve(label: str, runs: list[Run], y: str, x: str) -> Curve:
    per_run = []
    for run in runs:
        pts = {}
        for i, r in enumerate(run.records):
            if _number(r.get(x)) and _number(r.get(y)):
                pts[r["round"] if _number(r.get("round")) else i] = (r[x], r[y])
        per_run.append(pts)
    common = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    curve = Curve(label, [], [], [], [], [])
    for key in common:
        xs = [p[key][0] for p in per_run]
        iv = t_interval([p[key][1] for p in per_run])
        curve.x.append(sum(xs) / len(xs))
        curve.mean.append(iv.mean)
        curve.n.append(iv.n)
        curve.ci_low.append(None if iv.n < 2 else iv.low)
        curve.ci_high.append(None if iv.n < 2 else iv.high)
    return curve


def metric_keys(runs: list[Run]) -> list[str]:
    """Every numeric metric some record of ``runs`` has (what :func:`plot_runs` can draw)."""
    return sorted({k for run in runs for r in run.records for k, v in r.items() if _number(v)})


def figure_title(runs: list[Run]) -> str:
    """``dataset · partition · model · cohort`` from the runs' resolved configs; a part on
    which the runs differ is shown as ``mixed``."""
    parts = []
    for describe in (_dataset, _partition, _model, _cohort):
        values = {describe(r) for r in runs} - {None}
        if len(values) == 1:
            parts.append(values.pop())
        elif values:
            parts.append(f"mixed {describe.__name__.strip('_')}")
    return " · ".join(parts)


def _data(run: Run) -> dict:
    data = run.config.get("data")
    return data if isinstance(data, dict) else {}


def _dataset(run: Run) -> str | None:
    name = _data(run).get("dataset")
    if name is None and isinstance(run.config.get("tasks"), list):
        return f"{len(run.config['tasks'])} tasks"
    return name


def _partition(run: Run) -> str | None:
    data = _data(run)
    if "partition" not in data:
        return None
    opts = data.get("partition_options") or {}
    text = ", ".join(f"{'α' if k == 'alpha' else k}={v}" for k, v in sorted(opts.items()))
    return f"{data['partition']} partition" + (f" ({text})" if text else "")


def _model(run: Run) -> str | None:
    model = run.config.get("model")
    return model.get("name") if isinstance(model, dict) else None


def _cohort(run: Run) -> str | None:
    server = run.config.get("server")
    if not isinstance(server, dict) or "clients_per_round" not in server:
        return None
    total = (run.partition or {}).get("num_clients") or _data(run).get("num_clients")
    of = f" of {total}" if total else ""
    return f"{server['clients_per_round']}{of} clients per round"


@dataclass(frozen=True)
class FigureOptions:
    """How method figures show the seeds' spread and name the lines.

    ``bands``: ``alpha`` (shaded 95 % interval), ``off`` (means only) or ``panels`` (one
    panel per method, its band shaded, the other methods in grey). ``legend``: ``best``
    (inside the axes where it covers no line or band, else outside), ``outside`` (right of
    the axes) or ``off``."""

    bands: str = "alpha"
    legend: str = "best"

    def __post_init__(self) -> None:
        for name, value, allowed in (("bands", self.bands, BAND_STYLES),
                                     ("legend", self.legend, LEGEND_PLACES)):
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")


_OPTIONS: ContextVar[FigureOptions | None] = ContextVar("figure_options", default=None)


def current_options(bands: str | None = None, legend: str | None = None) -> FigureOptions:
    """The enclosing :func:`figure_options` (default: alpha bands, legend ``best``), with
    the given values in place of its own."""
    given = {k: v for k, v in (("bands", bands), ("legend", legend)) if v is not None}
    return replace(_OPTIONS.get() or FigureOptions(), **given)


@contextmanager
def figure_options(bands: str | None = None, legend: str | None = None
                   ) -> Iterator[FigureOptions]:
    """Options for every figure drawn inside the block (``compare`` draws several)."""
    opts = current_options(bands, legend)
    token = _OPTIONS.set(opts)
    try:
        yield opts
    finally:
        _OPTIONS.reset(token)


def named_order(runs: list[Run]) -> list[Run]:
    """``runs`` in the order a comparison named its methods (``compare -a``): a run in a
    ``compare --out`` folder (``<out>/<name>`` or ``<out>/<name>/seed<s>``) sorts by its
    name's row in ``<out>/table.json``; other runs keep their order, after them. So a
    legend lists the methods as ``-a`` did, also for ``fedforge plot runs/cmp/*``."""
    orders: dict[Path, list[str]] = {}

    def key(item: tuple[int, Run]) -> tuple[int, int, int]:
        i, run = item
        for up in (run.path.parent, run.path.parent.parent):
            names = orders.get(up)
            if names is None:
                names = orders[up] = _table_names(up / "table.json")
            name = run.path.relative_to(up).parts[0]
            if name in names:
                return (list(orders).index(up), names.index(name), i)
        return (len(runs), 0, i)

    return [run for _, run in sorted(enumerate(runs), key=key)]


def _table_names(path: Path) -> list[str]:
    """The method names of a comparison's ``table.json``, in its order ([] if none)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except (OSError, ValueError):
        return []
    if not isinstance(rows, list):
        return []
    return [str(r.get("algorithm", r.get("method"))) for r in rows if isinstance(r, dict)]


def plot_runs(
    runs: list[Run], out: Path, y: str | None = None, x: str = "round",
    title: str | None = None, logx: bool = False, average: bool = True,
    bands: str | None = None, legend: str | None = None,
) -> Path:
    """Draw ``y`` against ``x`` -> the PNG path (a PDF and the plotted numbers as JSON beside).

    ``y``: a metrics key (default: what the methods are judged by,
    :func:`fedforge.study.judged.comparison_metric`). ``x="bytes_up", logx=True``:
    accuracy against cumulative uplink bytes. The methods are drawn, and listed in the
    legend, in the order :func:`named_order` gives. A metric no record
    has is a ``ValueError`` listing the available ones (no empty plot is written). Multi-task
    runs are drawn per task against simulated time (rounds differ per task). ``bands`` and
    ``legend``: see :class:`FigureOptions` (default: the enclosing :func:`figure_options`)."""
    fig, data = draw(runs, y, x, title, logx, average, bands, legend)
    out = Path(out)
    try:
        for name in (out.name, out.with_suffix(".pdf").name):
            save_figure(out.parent, name, fig)
    finally:
        plt.close(fig)
    write_text(out.parent, out.with_suffix(".json").name, json.dumps(data, indent=1) + "\n")
    return out


def draw(
    runs: list[Run], y: str | None = None, x: str = "round", title: str | None = None,
    logx: bool = False, average: bool = True, bands: str | None = None,
    legend: str | None = None,
) -> tuple[Figure, dict]:
    """The figure of :func:`plot_runs` (the caller saves and closes it) and its numbers."""
    opts = current_options(bands, legend)
    runs = named_order(runs)
    y = comparison_metric(runs) if y is None else y
    if x == "round" and any("task" in r for run in runs for r in run.records):
        x = "sim_time_s"
    keys = metric_keys(runs)
    for name, value in (("metric", y), ("x", x)):
        if value not in keys:
            raise ValueError(f"{name} {value!r}: not in the metrics files; available: "
                             f"{', '.join(keys) or 'none (no records)'}")
    drawn = curves(runs, y, x, average)
    title = figure_title(runs) if title is None else title
    styles = curve_styles(drawn)
    if opts.bands == "panels" and drawn:
        fig, placed = _draw_panels(drawn, styles, x, y, logx, title), "off"
    else:
        fig, placed = _draw_single(drawn, styles, x, y, logx, title, opts)
    data = {"x": x, "y": y, "title": title, "bands": opts.bands, "band_alpha": BAND_ALPHA,
            "legend": placed,
            "curves": [{**c.__dict__, "color": st.color, "marker": st.marker}
                       for c, st in zip(drawn, styles)]}
    return fig, data


def curve_styles(drawn: list[Curve]) -> list[MethodStyle]:
    """Each curve in its method's style; a method's seeds drawn one by one (``--per-seed``)
    keep its colour and marker and differ in line style."""
    by_method = styles_for(c.method for c in drawn)
    out, seen = [], {}
    for c in drawn:
        style, k = by_method[c.method], seen.get(c.method, 0)
        seen[c.method] = k + 1
        if k:
            step = (LINESTYLES.index(style.linestyle) + k) % len(LINESTYLES)
            style = style._replace(linestyle=LINESTYLES[step])
        out.append(style)
    return out


def _draw_single(drawn: list[Curve], styles: list[MethodStyle], x: str, y: str, logx: bool,
                 title: str, opts: FigureOptions) -> tuple[Figure, str]:
    """Every method on one axes -> the figure and where its legend went."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=150, layout="constrained")
    for c, style in zip(drawn, styles):
        _line(ax, c, style)
        if opts.bands == "alpha":
            _band(ax, c, style.color, y)
    _axes(ax, x, y, logx)
    set_title(fig, title)
    if not drawn or opts.legend == "off":
        return fig, "off"
    note = BAND_NOTE if opts.bands == "alpha" and any(max(c.n) > 1 for c in drawn) else None
    return fig, place_legend(fig, ax, opts.legend, title=note, refit_title=title)


def _draw_panels(drawn: list[Curve], styles: list[MethodStyle], x: str, y: str, logx: bool,
                 title: str) -> Figure:
    """Small multiples: one panel per method with its band, the others thin and grey for
    reference, shared axes so the panels compare at a glance."""
    ncols = _panel_columns(len(drawn))
    nrows = math.ceil(len(drawn) / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(0.6 + 2.6 * ncols, 0.9 + 2.3 * nrows),
                             dpi=150, sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    for i, ax in enumerate(grid.flat):
        if i >= len(drawn):
            ax.set_visible(False)
            continue
        if i + ncols >= len(drawn):  # no panel below: this one shows the x tick labels
            ax.xaxis.set_tick_params(labelbottom=True)
        for other in drawn:
            if other is not drawn[i]:
                ax.plot(other.x, other.mean, color="0.78", linewidth=0.8, zorder=1)
        _line(ax, drawn[i], styles[i])
        _band(ax, drawn[i], styles[i].color, y)
        _axes(ax, x, y, logx, labels=False)
        label = wrap_to_width(fig, plain_text(drawn[i].label), 0.9 * fig.bbox.width / ncols,
                              fontsize="small")
        ax.set_title(label, fontsize="small", color=styles[i].color)
    fig.supxlabel(plain_text(axis_label(x)), fontsize="medium")
    # the y label wrapped to the figure's height; which model and data: in the note
    fig.supylabel(wrap_to_width(fig, plain_text(axis_label(y)), 0.8 * fig.bbox.height,
                                fontsize="medium"), fontsize="medium")
    source = metric(y).source
    note = "shaded: 95 % t-interval over seeds; grey: the other methods" \
        if any(max(c.n) > 1 for c in drawn) else "grey: the other methods"
    set_title(fig, title, note=note if source is None else f"{source} · {note}")
    return fig


def _panel_columns(n: int) -> int:
    """One row up to 3 panels, 2 x 2 for 4 (not 3 + 1), then rows of 3."""
    return n if n <= 3 else 2 if n == 4 else 3


def _line(ax, c: Curve, style: MethodStyle) -> None:
    ax.plot(c.x, c.mean, label=plain_text(c.label), color=style.color, marker=style.marker,
            linestyle=style.linestyle, markersize=4, linewidth=1.5,
            markevery=max(1, len(c.x) // 12), zorder=3)


def _band(ax, c: Curve, color: str, y: str) -> None:
    """The shaded interval, cut to what the metric can be (its declared
    :attr:`~fedforge.study.labels.Metric.bounds`): a t-interval of a few seeds'
    accuracies may reach below 0 or above 1, which no run can (the JSON keeps it whole)."""
    band = [(xv, lo, hi) for xv, lo, hi in zip(c.x, c.ci_low, c.ci_high) if lo is not None]
    if band:
        bx, lo, hi = zip(*band)
        bounded = metric(y)
        lo, hi = [bounded.clip(v) for v in lo], [bounded.clip(v) for v in hi]
        ax.fill_between(bx, lo, hi, color=color, alpha=BAND_ALPHA, linewidth=0, zorder=2)


def _axes(ax, x: str, y: str, logx: bool, labels: bool = True) -> None:
    if logx:
        ax.set_xscale("log")
    if x in ("round", "updates"):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if labels:
        ax.set_xlabel(plain_text(axis_label(x)))
        ax.set_ylabel(plain_text(y_label(y)))
    ax.grid(alpha=0.3)


def y_label(key: str) -> str:
    """The metric's name and, on a second line, which model on which data measured it."""
    described = metric(key)
    return described.label if described.source is None else \
        f"{described.label}\n{described.source}"


def set_title(fig: Figure, title: str | None, note: str | None = None) -> None:
    """The figure's title, wrapped to the figure's width (never clipped at its edge), with
    an optional smaller note line under it."""
    if not title and not note:
        return
    width = 0.96 * fig.bbox.width
    lines = [wrap_to_width(fig, plain_text(title), width, fontsize="medium")] if title else []
    if note:
        lines.append(wrap_to_width(fig, note, width, fontsize="medium"))
    fig.suptitle("\n".join(lines), fontsize="medium")


def place_legend(fig: Figure, ax, where: str, title: str | None = None,
                 refit_title: str | None = None) -> str:
    """A legend that hides no data -> where it went (``best`` or ``outside``).

    ``best`` keeps matplotlib's best spot inside the axes only if the legend then covers
    no line and no band; otherwise, and for ``outside``, the legend goes right of the axes
    and the figure grows by its width (``refit_title`` is then re-wrapped to the width)."""
    kw = {"fontsize": "small", "title": title, "title_fontsize": "x-small"}
    if where == "best":
        legend = ax.legend(loc="best", **kw)
        if not legend_hides_data(fig, ax, legend):
            return "best"
        legend.remove()
    legend = ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)
    fig.canvas.draw()
    fig.set_figwidth(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi + 0.1)
    if refit_title:
        set_title(fig, refit_title)
    return "outside"


def legend_hides_data(fig: Figure, ax, legend) -> bool:
    """Whether the drawn legend's box crosses a plotted line (its markers included) or
    covers part of a shaded band."""
    fig.canvas.draw()
    box = legend.get_window_extent().padded(3.0)
    for line in ax.get_lines():
        path = line.get_transform().transform_path(line.get_path())
        if len(path.vertices) and path.intersects_bbox(box, filled=False):
            return True
    for coll in ax.collections:
        transform = coll.get_transform()
        if any(transform.transform_path(p).intersects_bbox(box, filled=True)
               for p in coll.get_paths()):
            return True
    return False


def plain_text(text: object) -> str:
    """``text`` as matplotlib shows it literally: names come from run folders, and a ``$``
    pair would be parsed as mathtext (a malformed formula fails the whole figure)."""
    return str(text).replace("$", r"\$")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
