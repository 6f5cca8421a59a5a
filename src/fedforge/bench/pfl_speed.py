"""``fedforge bench pfl-ditto``: the speed of personalised FL, fedforge against a plain loop.

The workload is Ditto (λ = 1, one personal pass, local lr 0.01) on W1's schedule: every
client holds one epoch of 10 batches of 32 random 28×28 images with random labels
(``bench.workload.make_data``), LeNet-5 (``--model`` picks another zoo model), and every
client trains every round (the population is the cohort, PFLlib's default ``join_ratio =
1``), so after a round every client holds a personal model and has sent its global copy.

Two rows per cohort:

* ``fedforge``: fedforge's ``ditto`` through ``federated_round``, with the engine a config
  without an ``[engine]`` section gets (``auto``, which may start worker processes); the
  personal models live in the client store;
* ``plain``: Ditto as PFLlib and FL-bench write it (:mod:`fedforge.bench.pfl_speed_run`: an
  ``nn.Module`` per client in a dict, prox-SGD for the personal model, ``torch.optim.SGD``
  for the global copy, clients one after another) over single-threaded worker processes,
  one per core, the floor the other plain rows use.

Each row runs in a fresh subprocess, the rows of a group go round-robin over the cohorts
with the order rotated, so a slow minute of a shared machine falls on both alike. Reported:
seconds per round (median over the timed rounds after the warm-up, evaluation excluded),
client updates per second, the peak memory of the process tree (PSS,
:func:`fedforge.bench.pfl_cifar10.tree_memory`), global and personal accuracy on the
clients' own training samples after the last round (random labels: near chance, above it
only where a model memorises), the ratios fedforge ÷ plain, and whether both did the same
work: the global model and a sample of clients' personal models after the last round agree
to float tolerance (largest difference relative to the largest parameter).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated

import typer
from safetensors.torch import load_file

from fedforge.bench.options import Groups, Iterations, Out, Results, Warmup, folders
from fedforge.bench.pfl_cifar10 import launch
from fedforge.bench.results import record_results, run_info
from fedforge.bench.workload import LR, W1

FRAMEWORKS = ("fedforge", "plain")
COHORTS = (10, 100, 1000)
QUICK_COHORTS = (2, 3)
LAM = 1.0
DITTO_W1 = replace(W1, name="W1 Ditto", model="lenet5")
QUICK = replace(DITTO_W1, steps=2, batch=8)
SAME_TOLERANCE = 1e-4  # float32 rounding over a few rounds stays far below this
SAMPLE = 3  # clients whose personal models are compared: the first, middle and last
HEADER = ["cohort", "framework", "runs as", "s / round", "client updates / s",
          "peak memory MiB", "global accuracy", "personal accuracy", "time ÷ plain",
          "memory ÷ plain", "same work"]


@dataclass
class Run:
    """One framework's run at one cohort in one group, as its subprocess reported it."""

    framework: str
    cohort: int
    group: int
    label: str = ""
    round_s: list | None = None
    global_accuracy: float | None = None
    personal_accuracy: float | None = None
    peak: int = 0
    params: Path | None = None
    error: str | None = None


def parse_cohorts(text: str) -> list[int]:
    """``--cohorts``: comma-separated positive integers, or a one-line ``ValueError``."""
    try:
        cohorts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        cohorts = []
    if not cohorts or min(cohorts) < 1:
        raise ValueError(f"--cohorts: expected comma-separated integers >= 1, got {text!r}")
    return cohorts


def sample_clients(cohort: int) -> list[int]:
    """The clients whose personal models are compared across frameworks."""
    return sorted({0, cohort // 2, cohort - 1})[:SAMPLE]


def run_one(spec: dict, folder: Path, timeout_s: float) -> Run:
    """One framework at one cohort in a fresh subprocess; polls its process tree's memory."""
    name, cohort, group = spec["framework"], spec["cohort"], spec["group"]
    stem = folder / f"{name}-{cohort}"
    out_path = Path(f"{stem}.out")
    peak, why = launch("fedforge.bench.pfl_speed_run", spec, stem, timeout_s)
    if why is not None:
        return Run(name, cohort, group, error=why)
    res = json.loads(out_path.read_text())
    params = folder / f"{name}-{cohort}-{group}.safetensors"
    Path(f"{out_path}.safetensors").replace(params)
    return Run(name, cohort, group, res["label"], res["iteration_s"], res["global_accuracy"],
               res["personal_accuracy"], peak, params)


def _params(path: Path) -> dict:
    """A run's saved models: {"global": {name: t}, "personal": {client: {name: t}}}."""
    out: dict = {"global": {}, "personal": {}}
    for key, t in load_file(str(path)).items():
        kind, rest = key.split("/", 1)
        if kind == "global":
            out["global"][rest] = t
        else:
            client, name = rest.split("/", 1)
            out["personal"].setdefault(client, {})[name] = t
    return out


def params_difference(a: Path, b: Path) -> float:
    """Largest |a - b| over the global model and the sampled personal models, relative to
    the largest |b| (``inf`` where they hold different clients or leaves)."""
    pa, pb = _params(a), _params(b)
    trees = [(pa["global"], pb["global"])]
    if set(pa["personal"]) != set(pb["personal"]):
        return float("inf")
    trees += [(pa["personal"][c], pb["personal"][c]) for c in pb["personal"]]
    diff, scale = 0.0, 0.0
    for ta, tb in trees:
        if set(ta) != set(tb):
            return float("inf")
        for k in tb:
            diff = max(diff, float((ta[k] - tb[k]).abs().max()))
            scale = max(scale, float(tb[k].abs().max()))
    return diff / max(scale, 1e-12)


def run_pfl_ditto(out: Path, cohorts: list[int] | None = None, *, groups: int = 3,
                  warmup: int = 1, iterations: int = 5, quick: bool = False,
                  model: str | None = None, timeout_s: float = 3600.0
                  ) -> tuple[list[list[object]], str]:
    """Rows of :data:`HEADER` and a note (workload, load, cores) for the results table."""
    if groups < 1 or warmup < 0 or iterations < 1:
        raise ValueError("--groups and --iterations must be at least 1, --warmup at least 0")
    cohorts = list(cohorts or (QUICK_COHORTS if quick else COHORTS))
    work = QUICK if quick else DITTO_W1
    if model is not None:
        from fedforge.bench.workload import for_model
        from fedforge.models import MODELS

        if model not in MODELS:
            raise ValueError(f"--model: unknown model {model!r}; expected one of "
                             f"{sorted(MODELS)}")
        work = for_model(work, model)
    out.mkdir(parents=True, exist_ok=True)
    base = {"work": asdict(work), "warmup": warmup, "iterations": iterations, "lr": LR,
            "lam": LAM}
    runs: list[Run] = []
    for g in range(groups):
        for i, cohort in enumerate(cohorts):
            turn = (g + i) % len(FRAMEWORKS)
            for name in FRAMEWORKS[turn:] + FRAMEWORKS[:turn]:
                spec = {**base, "framework": name, "cohort": cohort, "group": g,
                        "sample": sample_clients(cohort)}
                runs.append(run_one(spec, out, timeout_s))
    rows = summarize(cohorts, runs)
    note = (f"Workload: Ditto (lam {LAM}, one personal pass, local lr {LR}) on {work.name}'s "
            f"schedule ({work.steps} steps x batch {work.batch}, random inputs and labels), "
            f"{work.model}, every client every round; accuracies on the clients' own training "
            f"samples. Same work: global and {SAMPLE} clients' personal models after the last "
            f"round, largest difference relative to the largest parameter, within "
            f"{SAME_TOLERANCE:g}. Groups: {groups}, each with {warmup} warm-up + {iterations} "
            f"timed rounds per row in a fresh process, round-robin.")
    return rows, note


def summarize(cohorts: list[int], runs: list[Run]) -> list[list[object]]:
    """Per cohort, one row per framework: medians over its groups' timed rounds, the peak
    memory over its groups, fedforge's ratios to plain and the same-work check (the worst
    group)."""
    rows: list[list[object]] = []
    for cohort in cohorts:
        stats: dict[str, dict] = {}
        for name in FRAMEWORKS:
            ok = [r for r in runs if r.framework == name and r.cohort == cohort
                  and r.error is None]
            if ok:
                stats[name] = {
                    "label": ok[-1].label,
                    "round": statistics.median(t for r in ok for t in r.round_s or []),
                    "mem": max(r.peak for r in ok) / 2**20,
                    "glob": statistics.median(r.global_accuracy for r in ok),
                    "pers": statistics.median(r.personal_accuracy for r in ok)}
        same = _same_work(cohort, runs)
        for name in FRAMEWORKS:
            if name not in stats:
                err = next((r.error for r in runs if r.framework == name
                            and r.cohort == cohort and r.error), "not run")
                rows.append([cohort, name, err] + [None] * (len(HEADER) - 3))
                continue
            s, ref = stats[name], stats.get("plain")

            def ratio(key: str, s=s, ref=ref) -> float | None:
                return None if ref is None or not ref[key] else round(s[key] / ref[key], 2)

            rows.append([cohort, name, s["label"], round(s["round"], 3),
                         round(cohort / s["round"], 1), round(s["mem"]), round(s["glob"], 4),
                         round(s["pers"], 4), ratio("round"), ratio("mem"),
                         same if name == "fedforge" else None])
    return rows


def _same_work(cohort: int, runs: list[Run]) -> str:
    """``yes (d)`` / ``NO (d)`` over the groups where both frameworks ran; ``-`` if none."""
    pairs: dict[int, dict[str, Path]] = {}
    for r in runs:
        if r.cohort == cohort and r.params is not None:
            pairs.setdefault(r.group, {})[r.framework] = r.params
    diffs = [params_difference(p["fedforge"], p["plain"]) for p in pairs.values()
             if len(p) == len(FRAMEWORKS)]
    if not diffs:
        return "-"
    worst = max(diffs)
    return f"{'yes' if worst <= SAME_TOLERANCE else 'NO'} ({worst:.1e})"



# ------------------------------------------------------------- fedforge bench pfl-ditto

Cohorts = Annotated[str | None, typer.Option(
    help="comma-separated cohort sizes (default 10,100,1000; with --quick 2,3)")]
Model = Annotated[str | None, typer.Option(
    help="another registered model on the workload's inputs (default lenet5)")]
Quick = Annotated[bool, typer.Option("--quick", help="cohorts 2 and 3, 2 steps of batch 8")]


def pfl_ditto(cohorts: Cohorts = None, groups: Groups = 3, warmup: Warmup = 1,
              iterations: Iterations = 5, quick: Quick = False, model: Model = None,
              out: Out = "runs/bench_pfl_ditto", results: Results = None) -> str:
    """Personalised FL: Ditto with fedforge's auto engine and a plain per-client loop,
    interleaved."""
    folder, results = folders(out, results)
    load_before = os.getloadavg()
    rows, note = run_pfl_ditto(folder, parse_cohorts(cohorts) if cohorts else None,
                               groups=groups, warmup=warmup, iterations=iterations,
                               quick=quick, model=model)
    title = "pfl-ditto (Ditto, fedforge auto vs a plain per-client loop)"
    return record_results(results, "pfl-ditto", (model or DITTO_W1.model)
                          + ("-quick" if quick else ""), title + (", --quick" if quick else ""),
                          HEADER, rows, run_info("cpu", load_before), [note])
