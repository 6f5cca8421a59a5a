"""Tables, figures and the verdict of a reproduction, from the committed raw metrics.

Reads ``<data>/<name>/<condition>/seed<k>.jsonl`` only, so ``--report-only`` regenerates
everything on a machine that never ran the grid. Writes ``<out>/reproductions/<name>.md``
and ``<out>/img/<name>_*.png``; ``out`` = the repository's ``docs`` rewrites the committed
page (linked from ``docs/reproductions.md``). The verdicts are Holm-corrected across the
page's comparisons, and a censored time never carries a call it could overturn (see
docs/reproducing.md, section 5). A multi-task spec
also reads ``seed<k>.summary.json`` (time to each task's target, idle share) and reports
simulated time to *every* target, per-task times and the paired gain over its baseline.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from fedforge.experiment.metrics import evaluated
from fedforge.experiment.rundir import save_figure, subfolder, write_text
from fedforge.reproduce.grid import diverged_path, read_marker, read_metrics, summary_path
from fedforge.reproduce.spec import Comparison, Reproduction, Sweep
from fedforge.reproduce.stats import INCONCLUSIVE, detectable_effect
from fedforge.reproduce.verdicts import (
    ALPHA,  # noqa: F401  (re-exported)
    Judgement,
    claim_text,
    correction_note,
    decide,
    evidence,
    judge,
)
from fedforge.study.stats import Interval, paired_difference, t_interval
from fedforge.study.styles import styles_for

METRICS = {  # key -> (column title, format, higher is better)
    "rounds": ("rounds to target", "{:.1f}", False),
    "sim_time": ("sim. s to target", "{:.3g}", False),
    "final_acc": ("final acc. (mean of last 5 evals)", "{:.4f}", True),
    # personalised FL: each client's model on its own test data, averaged over clients (for a
    # method without personal models, the global model's accuracy on the same data)
    "final_personal_acc": ("final mean per-client acc. (mean of last 5 evals)", "{:.4f}", True),
    "best_weighted_personal_acc": ("best sample-weighted per-client acc. (PFLlib's metric)",
                                   "{:.4f}", True),
    # fairness (q-FFL): the global model on each client's own test data, over clients
    "final_client_mean": ("final mean client acc. (mean of last 5 evals)", "{:.4f}", True),
    "final_client_p10": ("final 10th-percentile client acc. (mean of last 5 evals)", "{:.4f}",
                         True),
    "final_client_var": ("final variance of client acc. (mean of last 5 evals)", "{:.4f}",
                         False),
}
FAIRNESS = {"final_client_mean": "global_accuracy_mean", "final_client_p10": "global_accuracy_p10",
            "final_client_var": "global_accuracy_var"}  # RunSummary field -> metrics.jsonl key
PERSONAL_METRIC = "personal_accuracy_mean"  # the key final_personal_acc averages
WEIGHTED_METRIC = "personal_accuracy_weighted"  # pooled over the clients' test samples
FINAL_EVALS = 5


@dataclass
class RunSummary:
    """One finished run's numbers; ``reached`` False means rounds/time are censored at the
    budget (the run's last round and simulated time)."""

    seed: int
    rounds: float
    sim_time: float
    final_acc: float
    reached: bool
    sim_per_round: float
    history: list[dict]
    tasks: dict[str, float | None] = field(default_factory=dict)  # multi-task: T per task
    idle: float = math.nan  # multi-task: share of available client time left idle
    diverged_at: int | None = None  # stopped by non-finite values in this round
    final_personal_acc: float = math.nan  # mean of the last evaluations' PERSONAL_METRIC
    # PFLlib's metric: the best over evaluations of the sample-weighted per-client accuracy
    best_weighted_personal_acc: float = math.nan
    final_client_mean: float = math.nan  # the FAIRNESS keys, mean of the last evaluations
    final_client_p10: float = math.nan
    final_client_var: float = math.nan


def _final(history: list[dict], key: str) -> float:
    """Mean of ``key`` over the last FINAL_EVALS evaluations that report it (nan if none)."""
    evals = evaluated(history, key)[-FINAL_EVALS:]
    return sum(r[key] for r in evals) / len(evals) if evals else math.nan


def summarize(history: list[dict], seed: int, target: float | None, key: str) -> RunSummary:
    evals = evaluated(history, key)
    last = history[-1]  # the run's end: its budget when the target is never reached
    final = sum(r[key] for r in evals[-FINAL_EVALS:]) / max(1, len(evals[-FINAL_EVALS:]))
    hit = None if target is None else next((r for r in evals if r[key] >= target), None)
    rounds = float(hit["round"] if hit else last["round"])
    sim = float((hit or last).get("sim_time_s", math.nan))
    per_round = float(last.get("sim_time_s", math.nan)) / max(1, last["round"])
    weighted = [r[WEIGHTED_METRIC] for r in evaluated(history, WEIGHTED_METRIC)]
    return RunSummary(seed, rounds, sim, final, hit is not None, per_round, history,
                      final_personal_acc=_final(history, PERSONAL_METRIC),
                      best_weighted_personal_acc=max(weighted, default=math.nan),
                      **{name: _final(history, key) for name, key in FAIRNESS.items()})


def summarize_multitask(history: list[dict], summary: dict, seed: int,
                        key: str) -> RunSummary:
    """A multi-task run: ``sim_time`` = time to every task's target (censored at the run's
    end), ``rounds`` = client updates, ``final_acc`` = mean of each task's last evaluation."""
    done = summary.get("time_all_tasks")
    sim = float(done if done is not None else summary["sim_time_s"])
    updates = float(summary["updates"])
    last: dict[str, float] = {}
    for r in evaluated(history, key):
        last[r["task"]] = float(r[key])
    final = sum(last.values()) / max(1, len(last))
    idle = summary.get("idle_share")
    return RunSummary(seed, updates, sim, final, done is not None, sim / max(updates, 1.0),
                      history, dict(summary.get("time_to_target", {})),
                      math.nan if idle is None else float(idle))


def _diverged(run: RunSummary, stop: dict) -> RunSummary:
    """A run stopped by non-finite values: its final accuracy is that of its last evaluations
    before the divergence (an upper bound on what the diverged model scores), and a target it
    had not reached counts as missed at the full budget."""
    if not run.reached:
        run = replace(run, rounds=float(stop["budget"]))
    return replace(run, diverged_at=int(stop["round"]))


def found_seeds(spec: Reproduction, data: Path, cond: str) -> list[int]:
    """The spec's seeds and any further ``seed<k>.jsonl`` in the condition's folder (the
    seeds a power-rule rerun added with ``fedforge reproduce NAME --seeds``)."""
    extra = set()
    for path in (data / spec.name / cond).glob("seed*.jsonl"):
        digits = path.stem[len("seed"):]
        if digits.isdigit():
            extra.add(int(digits))
    return sorted(set(spec.seeds) | extra)


def load_runs(spec: Reproduction, data: Path) -> dict[str, dict[int, RunSummary]]:
    """Every finished run found under ``data`` -> ``{condition: {seed: summary}}``."""
    out: dict[str, dict[int, RunSummary]] = {}
    for cond in spec.conditions:
        runs = {}
        for seed in found_seeds(spec, data, cond.name):
            hist = read_metrics(data / spec.name / cond.name / f"seed{seed}.jsonl")
            if hist and spec.multitask:
                spath = summary_path(data, spec, cond.name, seed)
                if spath.is_file():
                    summary = json.loads(spath.read_text(encoding="utf-8"))
                    runs[seed] = summarize_multitask(hist, summary, seed, spec.metric)
            elif hist:
                runs[seed] = summarize(hist, seed, spec.target, spec.metric)
                marker = read_marker(diverged_path(data, spec, cond.name, seed))
                if marker is not None:
                    runs[seed] = _diverged(runs[seed], marker)
        out[cond.name] = runs
    return out


def _cell(runs: dict[int, RunSummary], metric: str) -> str:
    fmt = METRICS[metric][1]
    vals = [getattr(r, metric) for r in runs.values()]
    if runs and all(math.isnan(v) for v in vals):
        return "–"  # a metric these runs do not log (another setting's)
    text = t_interval(vals).format(fmt)
    if metric in ("rounds", "sim_time") and runs:
        k = sum(r.reached for r in runs.values())
        if k < len(runs):
            text = f"≥ {text} ({k}/{len(runs)} reached)"
    return text


def uses_target(spec: Reproduction) -> bool:
    """Whether time to a target belongs in the report: a claim on final accuracy alone has
    no target, and its tables leave the rounds-to-target columns out."""
    return spec.target is not None or any(c.metric in ("rounds", "sim_time")
                                          for c in spec.comparisons)


def uses_personal(spec: Reproduction) -> bool:
    """Whether the tables carry the mean per-client accuracy (a personalised-FL claim)."""
    return any(c.metric == "final_personal_acc" for c in spec.comparisons)


def _seeds(runs: dict[int, RunSummary]) -> str:
    """``0, 1†25, 2``: † marks a seed that diverged, with the round."""
    return ", ".join(f"{s}†{runs[s].diverged_at}" if runs[s].diverged_at else str(s)
                     for s in sorted(runs)) or "not run yet"


def uses_fairness(spec: Reproduction) -> bool:
    """Whether the tables carry the accuracy distribution over clients (a fairness claim)."""
    return any(c.metric in FAIRNESS for c in spec.comparisons)


def condition_table(spec: Reproduction, runs: dict, names: list[str] | None = None) -> str:
    names = names or [c.name for c in spec.conditions]
    target = "–" if spec.target is None else f"{spec.target:g}"
    to_target, personal, fair = uses_target(spec), uses_personal(spec), uses_fairness(spec)
    head = ["method", spec.paper_title,
            *([f"rounds to {target}", f"sim. s to {target}"] if to_target else []),
            "final acc.",
            *(["final per-client acc.", "best weighted per-client acc. (PFLlib's metric)"]
              if personal else []),
            *(["client acc.: mean", "10th percentile", "variance"] if fair else []),
            "sim. s / round", "seeds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        r = runs.get(name, {})
        per_round = t_interval([x.sim_per_round for x in r.values()]).format("{:.4f}")
        cells = [spec.condition(name).title, spec.paper.get(name, "–"),
                 *([_cell(r, "rounds"), _cell(r, "sim_time")] if to_target else []),
                 _cell(r, "final_acc"),
                 *([_cell(r, "final_personal_acc"), _cell(r, "best_weighted_personal_acc")]
                   if personal else []),
                 *([_cell(r, m) for m in FAIRNESS] if fair else []),
                 per_round if r else "–", _seeds(r)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def gains(base: dict[int, RunSummary], runs: dict[int, RunSummary]) -> Interval:
    """Paired ``(T_base - T) / T_base`` on the time to every target, over common seeds."""
    seeds = sorted(set(base) & set(runs))
    return t_interval([(base[s].sim_time - runs[s].sim_time) / base[s].sim_time for s in seeds
                       if base[s].sim_time > 0])


def multitask_table(spec: Reproduction, runs: dict, names: list[str] | None = None) -> str:
    """Time to every target, paired gain, per-task times, idle share, updates."""
    names = names or [c.name for c in spec.conditions]
    tasks = _tasks(runs)
    base = spec.gain_baseline
    head = ["method", spec.paper_title, "sim. s to every target",
            f"gain vs {spec.condition(base).title if base else '–'}", *[f"T {t}" for t in tasks],
            "idle share", "client updates", "seeds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        r = runs.get(name, {})
        gain = "–"
        if base and r and runs.get(base) and name != base:
            g = gains(runs[base], r)
            gain = "–" if g.n == 0 else g.format("{:+.1%}")
        per_task = []
        for t in tasks:
            vals = [x.tasks.get(t) for x in r.values()]
            hit = [v for v in vals if v is not None]
            cell = t_interval(hit).format("{:.3g}") if hit else "–"
            per_task.append(cell if len(hit) == len(vals) else f"{cell} ({len(hit)}/{len(vals)})")
        cells = [spec.condition(name).title, spec.paper.get(name, "–"), _cell(r, "sim_time"),
                 gain, *per_task,
                 t_interval([x.idle for x in r.values()]).format("{:.1%}") if r else "–",
                 t_interval([x.rounds for x in r.values()]).format("{:.0f}") if r else "–",
                 ", ".join(str(s) for s in sorted(r)) or "none"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _tasks(runs: dict) -> list[str]:
    """Task names in task-index order, over every run."""
    from fedforge.study.multitask_diagnostics import task_names

    out: list[str] = []
    for r in runs.values():
        for x in r.values():
            out += [t for t in task_names(x.history) if t not in out]
    return out


def plot_multitask(spec: Reproduction, runs: dict, path: Path) -> Path:
    """Accuracy against simulated time, one panel per task, the lowest seed of each
    condition; dotted lines mark the runs' end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = _tasks(runs)
    ncols = 2 if len(tasks) > 1 else 1
    nrows = max(1, -(-len(tasks) // ncols))
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.4 * nrows), squeeze=False)
    axes = dict(zip(tasks, grid.flat))
    for name in spec.curves or [c.name for c in spec.conditions]:
        if not runs.get(name):
            continue
        seed = min(runs[name])
        for t, ax in axes.items():
            pts = [(r["sim_time_s"], r[spec.metric]) for r in runs[name][seed].history
                   if r.get("task") == t and spec.metric in r]
            if pts:
                ax.plot(*zip(*pts), lw=1, label=f"{spec.condition(name).title} (seed {seed})")
    for t, ax in axes.items():
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("simulated time (s)")
        ax.grid(alpha=0.3)
    if axes:
        next(iter(axes.values())).legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, path, dpi=100)


def plot_allocation(spec: Reproduction, runs: dict, path: Path) -> Path | None:
    """Requests per task against simulated time (the lowest seed of each async condition)."""
    from fedforge.study.multitask_diagnostics import requests_over_time

    shown = [n for n in (spec.curves or [c.name for c in spec.conditions])
             if runs.get(n) and any("requests" in r for r in runs[n][min(runs[n])].history)]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.2), squeeze=False)
    for ax, name in zip(grid.flat, shown):
        seed = min(runs[name])
        for task, (xs, ys) in requests_over_time(runs[name][seed].history).items():
            ax.step(xs, ys, where="post", label=task)
        ax.set_title(f"{spec.condition(name).title} (seed {seed})", fontsize=8)
        ax.set_xlabel("simulated time (s)")
        ax.grid(alpha=0.3)
    grid.flat[0].set_ylabel("requests R_m")
    grid.flat[0].legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, path, dpi=100)


def _save(fig, path: Path, dpi: int) -> Path:
    """Write the figure through the folder's writer (no link followed) and close it."""
    import matplotlib.pyplot as plt

    try:
        return save_figure(path.parent, path.name, fig, dpi=dpi)
    finally:
        plt.close(fig)


def compare(spec: Reproduction, runs: dict, comp: Comparison) -> tuple[Interval, str, float]:
    """One comparison on its own (uncorrected 5 %) -> (CI, verdict, detectable effect); the
    page's verdicts come from :func:`judge`, which corrects within each family."""
    ev = evidence(spec, runs, comp)
    return ev.diff, decide(comp, ev, ev.p), detectable_effect(ev.diff)


def _verdict_cell(j: Judgement) -> str:
    if j.diff.n == 0:
        return "not run yet"
    text = j.call if j.call == INCONCLUSIVE else f"**{j.call}**"
    return text + (" (underpowered)" if j.underpowered else "")


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.2g}" if p >= 0.001 else "< 0.001"


def _fmt(j: Judgement, value: float) -> str:
    return "–" if value is None or math.isnan(value) else METRICS[j.comp.metric][1].format(value)


def _test_cell(j: Judgement) -> str:
    if j.signs is None:
        return j.test
    less, greater, unknown = j.signs
    return f"{j.test}: {less} <, {greater} >, {unknown} undetermined ({j.censored})"


def comparison_table(spec: Reproduction, runs: dict) -> str:
    timed = any(c.metric == "sim_time" for c in spec.comparisons)
    head = ["difference (paired by seed)", "family", "metric", "paper claims",
            "mean ± 95 % CI", *(["relative (b − a) / b"] if timed else []), "test", "p",
            "Holm p (family)", "verdict", "smallest effect that matters",
            "detectable effect", "seeds: has / needs"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for j in judge(spec, runs):
        comp, diff = j.comp, j.diff
        fmt = METRICS[comp.metric][1]
        ci = "–" if diff.n == 0 else diff.format(fmt)
        if diff.n >= 2:
            ci += f" [{fmt.format(diff.low)}, {fmt.format(diff.high)}]"
        rel = []
        if timed:
            g = gains(runs.get(comp.b, {}), runs.get(comp.a, {}))
            rel = ["–" if comp.metric != "sim_time" or g.n == 0 else g.format("{:+.1%}")]
        tested = diff.n >= 2
        rows.append("| " + " | ".join([
            f"{spec.condition(comp.a).title} − {spec.condition(comp.b).title}",
            f"{j.family} ({j.family_size})", METRICS[comp.metric][0], claim_text(comp), ci,
            *rel, _test_cell(j) if tested else "–", _p(j.p if tested else None),
            _p(j.p_holm if tested else None), _verdict_cell(j), _fmt(j, j.effect),
            _fmt(j, j.mde), f"{diff.n} / {'?' if j.needed is None else j.needed}"]) + " |")
    return "\n".join(rows)


def sensitivity_table(spec: Reproduction, data: Path) -> str:
    """Paired rounds-to-target differences at the spec's other targets (post hoc)."""
    comps = [c for c in spec.comparisons if c.metric == "rounds"]
    head = ["difference (rounds)", *[f"target {t:g}" for t in spec.sensitivity]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    per_target = {}
    for t in spec.sensitivity:
        per_target[t] = load_runs(replace(spec, target=t), data)
    for comp in comps:
        cells = []
        for t in spec.sensitivity:
            diff, call, _ = compare(spec, per_target[t], comp)
            cells.append("–" if diff.n < 2 else f"{diff.format('{:.1f}')} ({call})")
        if any(c != "–" for c in cells):
            rows.append("| " + " | ".join([f"{spec.condition(comp.a).title} − "
                                           f"{spec.condition(comp.b).title}", *cells]) + " |")
    return "\n".join(rows)


def _mean_curve(runs: dict[int, RunSummary], key: str) -> tuple[list[float], list[float]]:
    by_round: dict[int, list[float]] = {}
    for r in runs.values():
        for rec in r.history:
            if key in rec:
                by_round.setdefault(rec["round"], []).append(float(rec[key]))
    xs = sorted(by_round)
    return xs, [sum(by_round[x]) / len(by_round[x]) for x in xs]


def line_styles(spec: Reproduction, names: list[str]) -> dict[str, dict]:
    """``ax.plot`` keywords (colour, marker, line style) per condition: the two sides of a
    one-to-one comparison (a condition in no other comparison, e.g. "X + NAR" against "X")
    share a colour and marker, b dashed."""
    uses: dict[str, int] = {}
    for c in spec.comparisons:
        for side in (c.a, c.b):
            uses[side] = uses.get(side, 0) + 1
    looks = method_looks(spec, names)
    styles: dict[str, dict] = {}
    for c in spec.comparisons:
        if c.a in names and c.b in names and uses[c.a] == uses[c.b] == 1:
            styles[c.a], styles[c.b] = looks[c.a], {**looks[c.a], "ls": "--"}
    for name in names:
        styles.setdefault(name, looks[name])
    return styles


def _method_key(spec: Reproduction, name: str) -> str:
    """What a condition's colour is keyed by: its algorithm when it runs it unchanged (no
    overrides beyond those every condition of its panel shares, e.g. the partition), else
    its label without the panel's "setting: " prefix, so a method keeps its colour across
    panels."""
    cond = spec.condition(name)
    panel = next((ns for _, ns in spec.panels if name in ns), None)
    if panel is None:
        return cond.algorithm if not cond.overrides else name
    common = set.intersection(*(set(spec.condition(n).overrides) for n in panel))
    if set(cond.overrides) <= common:
        return cond.algorithm
    return cond.title.split(": ", 1)[-1]


def claim_metric(spec: Reproduction) -> str:
    """The metrics.jsonl key the claim is judged on: the per-client accuracy for a
    personalised-FL claim, else the spec's metric."""
    return PERSONAL_METRIC if uses_personal(spec) else spec.metric


def method_looks(spec: Reproduction, names: list[str]) -> dict[str, dict]:
    """Each condition's colour and marker, keyed by its method as in every other fedforge
    figure: the algorithm for a condition that runs it unchanged, else the condition's own
    name. Markers (every tenth point) keep apart two methods that share a colour."""
    keys = {n: _method_key(spec, n) for n in names}
    styles = styles_for(keys.values())
    return {n: {"color": styles[k].color, "marker": styles[k].marker, "markevery": 0.1,
                "markersize": 4, "ls": "-"} for n, k in keys.items()}


def plot_accuracy(spec: Reproduction, runs: dict, path: Path) -> Path:
    """Mean curve per condition; one panel per ``spec.panels`` entry (default: one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = spec.panels or (("", tuple(spec.curves or [c.name for c in spec.conditions])),)
    fig, grid = plt.subplots(1, len(panels), figsize=(7 if len(panels) == 1 else 5.2 *
                                                       len(panels), 4.2), squeeze=False)
    looks = method_looks(spec, sorted({n for _, ns in panels for n in ns}))
    styles = {} if spec.panels else line_styles(spec, [n for n in panels[0][1] if runs.get(n)])
    for ax, (title, names) in zip(grid.flat, panels, strict=True):
        for name in names:
            if not runs.get(name):
                continue
            xs, ys = _mean_curve(runs[name], claim_metric(spec))
            if spec.x_axis != "round":  # e.g. cumulative bytes_up: its mean at each round
                at = dict(zip(*_mean_curve(runs[name], spec.x_axis), strict=True))
                xs, ys = [at[x] for x in xs if x in at], [y for x, y in zip(xs, ys,
                                                                           strict=True) if x in at]
            label = spec.condition(name).title
            if title:  # the panel names the regime: drop a "regime: " prefix
                label = label.split(": ", 1)[-1]
            ax.plot(xs, ys, **(styles.get(name) or looks[name]),
                    label=f"{label} ({_n_seeds(len(runs[name]))})")
        if spec.target is not None:
            ax.axhline(spec.target, color="grey", ls="--", lw=0.8,
                       label=f"target {spec.target:g}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(spec.x_axis)
        if spec.x_axis != "round":
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        if not spec.panels and ax.get_legend_handles_labels()[0]:  # none while runs are to come
            ax.legend(fontsize=7)
    grid.flat[0].set_ylabel(f"{claim_metric(spec)} (mean over seeds)")
    if spec.panels:  # one legend for every panel, below them: a method has one look
        handles = {}
        for ax in grid.flat:
            for line, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, line)
        _legend_below(fig, handles, height=4.2)
    else:
        fig.tight_layout()
    return _save(fig, path, dpi=110)


def _legend_below(fig, handles: dict, height: float, ncol: int = 5) -> None:
    """A figure legend under the panels (never over data), and the panels laid out above."""
    lines = -(-len(handles) // ncol) if handles else 0
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", fontsize=7,
                   ncol=min(ncol, len(handles)), frameon=False)
    fig.set_figheight(height + 0.2 * lines)
    fig.tight_layout(rect=(0, (0.2 * lines + 0.1) / (height + 0.2 * lines), 1, 1))


def _diagnostic_rows(spec: Reproduction, runs: dict,
                     keys: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """(row title, conditions, metrics) of the diagnostics figure: one row per panel of the
    accuracy figure (a setting), else one row. A row shows the metrics some of its runs log
    and is left out when none logs a diagnostic (the claim's metric alone is the accuracy
    figure's); only conditions that log a diagnostic are drawn."""
    rows = list(spec.panels) or [("", tuple(spec.curves or runs))]
    out = []
    for title, names in rows:
        shown = [name for name in names if any(
            _mean_curve(runs.get(name, {}), k)[0] for k in spec.diagnostics)]
        logged = [k for k in keys
                  if any(_mean_curve(runs[name], k)[0] for name in shown)]
        if set(logged) & set(spec.diagnostics):
            out.append((title, shown, logged))
    return out


def plot_diagnostics(spec: Reproduction, runs: dict, path: Path) -> Path | None:
    """The claim's metric and each diagnostic against rounds, one row per setting; one
    legend below the panels (a method keeps its colour in every panel)."""
    if not spec.diagnostics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys([claim_metric(spec), *spec.diagnostics]))
    rows = _diagnostic_rows(spec, runs, keys)
    if not rows:
        return None
    if spec.panels:
        ncols, nrows = max(len(logged) for _, _, logged in rows), len(rows)
    else:
        keys = rows[0][2]
        ncols = min(3, len(keys))
        nrows = -(-len(keys) // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.7 * nrows + 0.3),
                             squeeze=False)
    if spec.panels:
        cells = [(title, names, logged, list(axes)[: len(logged)])
                 for (title, names, logged), axes in zip(rows, grid, strict=True)]
    else:
        cells = [(*rows[0], list(grid.flat)[: len(keys)])]
    used = {id(ax) for *_, axes in cells for ax in axes}
    for ax in grid.flat:
        ax.set_visible(id(ax) in used)
    # the accuracy figure's looks: keyed by the same set of conditions, so they match
    looks = method_looks(spec, sorted({n for _, ns in spec.panels for n in ns}
                                      or {n for _, ns, _ in rows for n in ns}))
    styles = looks if spec.panels else line_styles(spec, rows[0][1])
    legend: dict[str, object] = {}
    for title, names, logged, axes in cells:
        for name in names:
            label = spec.condition(name).title
            label = label.split(": ", 1)[-1] if title else label
            for ax, key in zip(axes, logged):
                xs, ys = _mean_curve(runs[name], key)
                if xs:
                    (line,) = ax.plot(xs, ys, **styles[name], label=label)
                    legend.setdefault(label, line)
        for ax, key in zip(axes, logged):
            ax.set_title(f"{title}\n{key}" if title else key, fontsize=8)
            ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    _legend_below(fig, legend, height=2.7 * nrows + 0.3)
    return _save(fig, path, dpi=100)


def _sweep_rows(runs: dict, sweep: Sweep) -> list[tuple[float, Interval, Interval, Interval]]:
    """Per value: final metric of a and of b, and the paired a − b (common seeds)."""
    rows = []
    for value, a, b in sweep.points:
        ra, rb = runs.get(a, {}), runs.get(b, {})
        common = sorted(set(ra) & set(rb))
        rows.append((value, t_interval([r.final_acc for r in ra.values()]),
                     t_interval([r.final_acc for r in rb.values()]),
                     paired_difference([ra[s].final_acc for s in common],
                                       [rb[s].final_acc for s in common])))
    return rows


def sweep_table(runs: dict, sweep: Sweep) -> str:
    fmt = METRICS["final_acc"][1]
    head = [sweep.parameter, f"{sweep.a_label}: final acc.", f"{sweep.b_label}: final acc.",
            f"{sweep.a_label} − {sweep.b_label} (paired)", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for value, a, b, diff in _sweep_rows(runs, sweep):
        ci = "–" if diff.n == 0 else diff.format(fmt)
        if diff.n >= 2:
            ci += f" [{fmt.format(diff.low)}, {fmt.format(diff.high)}]"
        cells = [f"{value:g}", "–" if a.n == 0 else a.format(fmt),
                 "–" if b.n == 0 else b.format(fmt), ci, str(diff.n)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweep(runs: dict, sweep: Sweep, path: Path) -> Path:
    """Left: final metric of a and b against the parameter (log axis), mean ± 95 % CI over
    seeds; right: their paired difference with its CI and the zero line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in _sweep_rows(runs, sweep) if r[3].n]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))

    def bars(ax, xs, ivs, **kw):
        ax.errorbar(xs, [iv.mean for iv in ivs],
                    yerr=[0.0 if math.isnan(iv.half) else iv.half for iv in ivs],
                    capsize=3, **kw)

    xs = [r[0] for r in rows]
    bars(left, xs, [r[1] for r in rows], fmt="o-", label=sweep.a_label)
    bars(left, xs, [r[2] for r in rows], fmt="s--", label=sweep.b_label)
    bars(right, xs, [r[3] for r in rows], fmt="o-", color="C2")
    right.axhline(0.0, color="grey", lw=0.8)
    left.set_ylabel("final acc. (mean of last 5 evals)")
    right.set_ylabel(f"{sweep.a_label} − {sweep.b_label}, paired")
    left.legend(fontsize=8)
    for ax in (left, right):
        if xs:  # a log axis of no points cannot be drawn (a sweep not run yet)
            ax.set_xscale("log")
        ax.set_xlabel(sweep.parameter)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{sweep.title} (mean ± 95 % CI over seeds)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path, dpi=110)


def _verdict_line(spec: Reproduction, j: Judgement) -> str:
    """``- a − b, metric [primary]: CI over n seeds → call (test, p, Holm p); power``."""
    comp, diff = j.comp, j.diff
    fmt = METRICS[comp.metric][1]
    cens = f" ({j.censored}, censored)" if j.censored else ""
    raw = _p(j.p) if j.p < 0.001 else f"= {_p(j.p)}"
    claim = claim_text(comp).replace(chr(92), "")
    notes = [f"the paper claims {claim}" if comp.kind != "none" else
             "the paper makes no claim" + (f" ({comp.note})" if comp.note else "")]
    if j.signs is not None:
        low = min(1.0, 2 / 2 ** diff.n)
        notes.append(f"an exact test on {_n_seeds(diff.n)} cannot go below p = {low:.2g}")
    if j.call == INCONCLUSIVE and j.uncorrected != INCONCLUSIVE:
        notes.append(f"{j.uncorrected} before the correction")
    power = [f"smallest effect that matters {_fmt(j, j.effect)}"]
    if not math.isnan(j.mde):
        power.append(f"detectable {_fmt(j, j.mde)}")
    if j.underpowered:
        power.append(f"underpowered: needs {j.needed} seeds, has {diff.n}")
    elif j.needed is not None:
        power.append(f"needs {j.needed} seeds, has {diff.n}")
    call = f"**{j.call}**" if j.call != INCONCLUSIVE else j.call
    return (f"- {spec.condition(comp.a).title} − {spec.condition(comp.b).title}, "
            f"{METRICS[comp.metric][0]} [{j.family}]: {diff.format(fmt)} over "
            f"{_n_seeds(diff.n)}{cens} → {call} ({j.test}, p {raw}, Holm-adjusted "
            f"{_p(j.p_holm)} in a family of {j.family_size}); {'; '.join(notes)}; "
            f"{', '.join(power)}.")


def not_run(spec: Reproduction, runs: dict) -> list[str]:
    """The conditions with no finished run yet."""
    return [c.name for c in spec.conditions if not runs.get(c.name)]


def pending_section(spec: Reproduction, runs: dict) -> list[str]:
    """The conditions not run yet, with the (resumable) command that runs them."""
    names = not_run(spec, runs)
    if not names:
        return []
    titles = ", ".join(spec.condition(n).title for n in names)
    return [f"**Not run yet:** {titles}. Their rows and comparisons are empty until "
            f"`fedforge reproduce {spec.name} --conditions {','.join(names)}` has run "
            "(resumable; the raw metrics land in docs/data).", ""]


def effects_section(spec: Reproduction) -> list[str]:
    """The smallest effect that matters per metric, with its reason."""
    lines = [f"- {METRICS[m][0]}: {METRICS[m][1].format(v)} ({why})"
             for m, (v, why) in spec.effects.items()]
    if any(c.kind == "equivalence" for c in spec.comparisons):
        lines.append("- an \"as good as\" claim: its own margin (two one-sided tests)")
    return ["**Smallest effects that matter** (fixed in the spec; the power rule sizes the "
            "seeds from them):", "", *lines, ""] if lines else []


def _seed_range(n: int) -> str:
    return "0" if n == 1 else f"0-{n - 1}"


def missing_hours(runs: dict, needed: dict[str, int]) -> float:
    """Wall hours the missing seeds would take: per condition, the seeds short of
    ``needed[name]`` times the median wall time of its committed runs."""
    total = 0.0
    for name, need in needed.items():
        walls = [r.history[-1].get("wall_s", math.nan) for r in runs.get(name, {}).values()
                 if r.history]
        walls = [w for w in walls if math.isfinite(w)]
        if walls:
            total += max(0, need - len(runs[name])) * statistics.median(walls)
    return total / 3600


def power_section(spec: Reproduction, judged: list[Judgement], runs: dict) -> list[str]:
    """What the power rule asks for the primary claims, what it would cost, and the command
    that runs it."""
    short = [j for j in judged if j.family != "exploratory" and j.underpowered]
    if not short:
        return []
    need = max(j.needed for j in short)
    needed: dict[str, int] = {}
    for j in short:
        for name in (j.comp.a, j.comp.b):
            needed[name] = max(needed.get(name, 0), j.needed)
    conds = sorted(needed, key=[c.name for c in spec.conditions].index)
    has = min(j.diff.n for j in short)
    hours = missing_hours(runs, needed)
    cost = (f" At the committed runs' median wall time the missing seeds would take about "
            f"{hours:.1f} hours of the 2-core CPU that ran them." if hours > 0 else "")
    return [f"**Underpowered: {len(short)} of {sum(j.family != 'exploratory' for j in judged)} "
            f"primary comparisons need more seeds than the committed data hold** (the most: "
            f"{need} seeds, the data hold {has}); their verdicts stand as computed, but an "
            f"inconclusive one says little.{cost} The seeds the power rule asks for, resumable: "
            f"`fedforge reproduce {spec.name} --seeds {_seed_range(need)} "
            f"--conditions {','.join(conds)}`. The pilot's spread sets these counts; the page "
            "recomputes them from whatever seeds are committed.", ""]


def _n_seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def headline(spec: Reproduction, runs: dict) -> list[str]:
    return [_verdict_line(spec, j) if j.diff.n > 0 else
            f"- {spec.condition(j.comp.a).title} − {spec.condition(j.comp.b).title}, "
            f"{METRICS[j.comp.metric][0]} [{j.family}]: not run yet."
            for j in judge(spec, runs)]


def seeds_line(spec: Reproduction, runs: dict) -> str:
    """The seeds the tables rest on: a setting given more seeds than the spec's says so."""
    ran = sorted({seed for by_seed in runs.values() for seed in by_seed})
    if not ran or ran == sorted(spec.seeds):
        return f"Seeds {', '.join(map(str, spec.seeds))}"
    return (f"Seeds {', '.join(map(str, spec.seeds))}, and more in the settings whose "
            "seeds column lists them")


def write_report(spec: Reproduction, data: Path, out: Path, *, command: str = "") -> Path:
    """Write ``<out>/reproductions/<name>.md`` and ``<out>/img/<name>_*.png`` (the layout of
    the repository's ``docs``, so the page's image links hold in both); -> the page."""
    runs = load_runs(spec, data)
    done = sum(len(set(r) & set(spec.seeds)) for r in runs.values())
    total = len(spec.conditions) * len(spec.seeds)
    img = subfolder(out, "img")  # a link to a folder elsewhere is refused
    if spec.multitask:
        acc_png = plot_multitask(spec, runs, img / f"{spec.name}_accuracy.png")
        diag_png = plot_allocation(spec, runs, img / f"{spec.name}_diagnostics.png")
        table = multitask_table
    else:
        acc_png = plot_accuracy(spec, runs, img / f"{spec.name}_accuracy.png")
        diag_png = plot_diagnostics(spec, runs, img / f"{spec.name}_diagnostics.png")
        table = condition_table
    text = [f"<!-- generated by `fedforge reproduce {spec.name}`; do not edit by hand -->",
            f"### Reproduction `{spec.name}` (generated)", ""]
    if done < total:
        text += [f"> **incomplete: {done} of {total} runs** finished; the tables use the "
                 "finished ones. Resume with the command below.", ""]
    text += [f"**Claim.** {spec.claim}", "", spec.notes.strip(), ""]
    if spec.target is None and uses_target(spec) and not spec.multitask:
        text += ["**Target:** not set yet (rounds and time to target are the run length).", ""]
    censored = ("; \"≥\" marks runs that never reached the target (counted at the budget, so "
                "the difference is a bound)") if uses_target(spec) else ""
    if any(r.diverged_at for c in runs.values() for r in c.values()):
        censored += ("; \"s†r\" marks seed s stopped by non-finite values in round r: its "
                     "final accuracy is that of its last evaluations before (an upper bound)")
    text += [f"{seeds_line(spec, runs)}; mean ± 95 % t-interval over the seeds "
             f"that finished{censored}.", "",
             table(spec, runs, list(spec.curves) or None), ""]
    for title, names in spec.ablations:
        text += [f"**{title}.**", "", table(spec, runs, list(names)), ""]
    for i, sweep in enumerate(spec.sweeps):
        png = plot_sweep(runs, sweep, img / f"{spec.name}_sweep{i}.png")
        text += [f"**{sweep.title}.**", "", sweep_table(runs, sweep), "",
                 f"![{sweep.title}](../img/{png.name})", ""]
    judged = judge(spec, runs)
    text += [*pending_section(spec, runs),
             "**Paired comparisons** (same seed = same partition, cohorts and batches). "
             + correction_note(spec), "", *effects_section(spec),
             comparison_table(spec, runs), "",
             "**Verdict.**" if done == total else "**Verdict so far.**", "", *headline(spec, runs),
             "", *power_section(spec, judged, runs)]
    if spec.sensitivity:
        text += ["**Sensitivity to the target (post hoc; the verdict above uses the target "
                 "fixed in advance).** Paired differences in rounds, mean ± 95 % CI, each "
                 "judged on its own (uncorrected).", "",
                 sensitivity_table(spec, data), ""]
    text += [f"![accuracy](../img/{acc_png.name})", ""]
    if diag_png is not None:
        text += [f"![diagnostics](../img/{diag_png.name})", ""]
    if command:
        text += [f"Command: `{command}`", ""]
    return write_text(out, Path("reproductions", f"{spec.name}.md"),
                      "\n".join(text).rstrip() + "\n")


def paper_scale(spec: Reproduction) -> str:
    """What ``--scale paper`` prints: the commands and the compute they need."""
    lines = [f"# {spec.name} at the paper's scale (not run here)", *spec.paper_commands]
    if spec.paper_compute:
        lines += ["", f"# compute: {spec.paper_compute}"]
    return "\n".join(lines)
