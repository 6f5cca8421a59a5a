"""Figures of run folders: mean over seeds with a 95 % t-interval band, one style per method.

matplotlib with the Agg backend (works headless). Every figure is written three times: a PNG,
a vector PDF beside it, and a JSON file with the plotted numbers (``<name>.json``: each curve's
x, mean, interval and number of seeds), so a figure can be checked or redrawn without the
runs. Runs are grouped by their resolved config without the seed; a group of several seeds is
drawn as its mean with the t-based 95 % interval of :mod:`fedforge.reproduce.stats`.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedforge.experiment.labels import axis_label  # noqa: E402
from fedforge.experiment.partition_stats import load_partition_stats  # noqa: E402
from fedforge.experiment.rundir import save_figure, write_text  # noqa: E402
from fedforge.reproduce.stats import t_interval  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

logger = logging.getLogger(__name__)

# Okabe & Ito's colour-blind-safe palette, darkest first (yellow last: weak on white)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2)),
              (0, (8, 2, 2, 2)))
BAND_ALPHA = 0.2
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
            if curve.x:
                out.append(curve)
    return out


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


def plot_runs(
    runs: list[Run], out: Path, y: str = "test_accuracy", x: str = "round",
    title: str | None = None, logx: bool = False, average: bool = True,
) -> Path:
    """Draw ``y`` against ``x`` -> the PNG path (a PDF and the plotted numbers as JSON beside).

    ``x="bytes_up", logx=True``: accuracy against cumulative uplink bytes. A metric no record
    has is a ``ValueError`` listing the available ones (no empty plot is written). Multi-task
    runs are drawn per task against simulated time (rounds differ per task)."""
    fig, data = draw(runs, y, x, title, logx, average)
    out = Path(out)
    try:
        for name in (out.name, out.with_suffix(".pdf").name):
            save_figure(out.parent, name, fig)
    finally:
        plt.close(fig)
    write_text(out.parent, out.with_suffix(".json").name, json.dumps(data, indent=1) + "\n")
    return out


def draw(
    runs: list[Run], y: str = "test_accuracy", x: str = "round", title: str | None = None,
    logx: bool = False, average: bool = True,
) -> tuple[Figure, dict]:
    """The figure of :func:`plot_runs` (the caller saves and closes it) and its numbers."""
    if x == "round" and any("task" in r for run in runs for r in run.records):
        x = "sim_time_s"
    keys = metric_keys(runs)
    for name, value in (("metric", y), ("x", x)):
        if value not in keys:
            raise ValueError(f"{name} {value!r}: not in the metrics files; available: "
                             f"{', '.join(keys) or 'none (no records)'}")
    drawn = curves(runs, y, x, average)
    title = figure_title(runs) if title is None else title
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=150)
    colors = []
    for i, c in enumerate(drawn):
        color = PALETTE[i % len(PALETTE)]
        colors.append(color)
        ax.plot(c.x, c.mean, label=plain_text(c.label), color=color,
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)], markersize=4, linewidth=1.5,
                markevery=max(1, len(c.x) // 12))
        band = [(xv, lo, hi) for xv, lo, hi in zip(c.x, c.ci_low, c.ci_high) if lo is not None]
        if band:
            bx, lo, hi = zip(*band)
            ax.fill_between(bx, lo, hi, color=color, alpha=BAND_ALPHA, linewidth=0)
    if logx:
        ax.set_xscale("log")
    if x in ("round", "updates"):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(plain_text(axis_label(x)))
    ax.set_ylabel(plain_text(axis_label(y)))
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize="small", title=("shaded: 95 % t-interval over seeds"
                                           if any(max(c.n) > 1 for c in drawn) else None),
                  title_fontsize="x-small")
    if title:
        ax.set_title(plain_text(title), fontsize="medium")
    fig.tight_layout()
    data = {"x": x, "y": y, "title": title, "band_alpha": BAND_ALPHA,
            "curves": [{**c.__dict__, "color": col} for c, col in zip(drawn, colors)]}
    return fig, data


def plain_text(text: object) -> str:
    """``text`` as matplotlib shows it literally: names come from run folders, and a ``$``
    pair would be parsed as mathtext (a malformed formula fails the whole figure)."""
    return str(text).replace("$", r"\$")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
