"""``fedforge bench pfl-cifar10``: pfl-research's CIFAR-10 speed workload, run side by side.

The workload is pfl-research's CIFAR-10 benchmark (its ``cifar10_iid`` baseline): 1000 users
of 50 training images each, cohorts of 50, one local epoch of batches of 10 (5 SGD steps) at
local learning rate 0.1, FedAvg with central learning rate 1 (the mean of the clients'
models), and its ``simple_cnn`` (the zoo's ``pfl_simple_cnn``, 1,626,442 parameters). Each
framework runs it the way its authors do:

* ``fedforge`` (engine ``auto`` by default, or named engines: ``fedforge:procs``,
  ``fedforge:loop`` ...): fedforge's FedAvg and engine through ``federated_round``;
* ``pfl``: pfl-research's ``FederatedAveraging`` on its ``SimulatedBackend`` with a
  ``PyTorchModel``, NHWC images transposed in the model as its benchmark feeds them, one
  process using every core through intra-op threads (``--peer-python``: a Python that has
  ``pfl`` and can import fedforge); ``pfl:procs`` runs it as pfl-research's distributed
  simulation, one single-threaded process per core launched by ``torchrun``, each training
  its share of the cohort, the updates summed with ``torch.distributed``;
* ``flower``: Flower's simulation engine, one supernode per user, one CPU and one thread per
  client actor;
* ``plain``: the same FedAvg as a hand-written PyTorch loop, split over as many
  single-threaded worker processes as there are cores.

All use the same users, cohorts (drawn from the seed and the iteration), batches (each
user's images in order), initial weights and test set. Each framework runs in a fresh
subprocess per group, and the groups go round-robin with the order rotated, so a slow
minute of a shared machine falls on every framework alike. Reported: seconds per iteration
(median over the timed iterations after the warm-up, central evaluation excluded), client
updates per second, start-up seconds (launch to the first iteration), the first (warm-up)
iteration, the peak memory of the framework's process tree (the sum of its
processes' proportional set sizes, :func:`tree_memory`), test accuracy after the last
iteration, and each ratio to fedforge's row. A framework that is not installed or fails
gets a row saying so.

With ``--target ACC`` each row also evaluates the global model's test accuracy every
``--eval-every`` iterations (warm-up included: time to accuracy runs from the first
iteration), outside the timed region, until it reaches the target, and the table gets
:data:`TARGET_HEADER` after the other columns: the first evaluated iteration at or above the
target and the training seconds from the first iteration's start through it (evaluations
excluded), medians over the groups; a row that never reached it reads "≥ N" (censored: N
iterations run, or the seconds they trained). Under the table, :func:`bf16_check` says for
each framework with an fp32 and a bf16 row whether bf16 needed more iterations.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from fedforge.bench.options import Groups, Iterations, Out, Results, Warmup, folders

FRAMEWORKS = ("fedforge", "pfl", "flower", "plain")
FEDFORGE_ENGINES = ("auto", "loop", "vmap", "procs")
ENGINES = {"fedforge": FEDFORGE_ENGINES, "pfl": ("procs",)}  # what may follow "name:"
HEADER = ["framework", "runs as", "s / iteration", "client updates / s", "start-up s",
          "first iteration s", "peak memory MiB", "accuracy", "time ÷ fedforge",
          "start-up ÷ fedforge", "memory ÷ fedforge"]
TARGET_HEADER = ["iterations to target", "s to target"]  # after HEADER, with --target
TARGET_KEYS = ("curve", "iterations_to_target", "s_to_target", "iterations_run", "trained_s")
PFL_INSTALL = 'pip install "fedforge[bench]" (into its own environment: --peer-python)'


@dataclass(frozen=True)
class Workload:
    """pfl-research's CIFAR-10 benchmark settings (``configs/baseline.yaml``)."""

    users: int = 1000
    per_user: int = 50
    cohort: int = 50
    epochs: int = 1
    batch: int = 10
    local_lr: float = 0.1
    central_lr: float = 1.0
    eval_batch: int = 10000
    test_size: int = 10000
    model: str = "pfl_simple_cnn"
    seed: int = 0

    @property
    def steps(self) -> int:
        """Local SGD steps per client: the user's epochs of whole batches."""
        return self.epochs * (self.per_user // self.batch)


PFL_CIFAR10 = Workload()
QUICK = replace(PFL_CIFAR10, users=16, per_user=20, cohort=4, eval_batch=500, test_size=500)


def cohort_ids(work: Workload, iteration: int) -> list[int]:
    """The users of iteration ``iteration`` (1-based): the same in every framework."""
    rng = np.random.default_rng([work.seed, iteration])
    return [int(u) for u in rng.choice(work.users, work.cohort, replace=False)]


def user_rows(work: Workload, user: int) -> range:
    """Rows of the prepared training arrays holding ``user``'s images, in batch order."""
    return range(user * work.per_user, (user + 1) * work.per_user)


# --- data: prepared once per command, read by every subprocess ------------------------------


def prepare_data(work: Workload, data_root: str | Path | None, folder: Path,
                 synthetic_ok: bool) -> dict:
    """Write the users' training images (uint8, NCHW, user after user), their labels and the
    test set to ``folder``; returns the per-channel mean and std of the training images
    (pfl-research normalises with them) and where the data came from. Without CIFAR-10 under
    the data root (``--data-root``, else ``$FEDFORGE_DATA``), random images when
    ``synthetic_ok`` (``--quick``), else a one-line error."""
    from fedforge.data.base import find_dataset_dir
    from fedforge.data.images import load_cifar_split
    from fedforge.data.root import resolve_data_root

    try:
        src = find_dataset_dir(resolve_data_root(data_root).path, "cifar10", "train_labels.npy")
        tr_x, tr_y = load_cifar_split(src, "train")
        te_x, te_y = load_cifar_split(src, "test")
        source = "CIFAR-10"
    except (OSError, ValueError) as exc:
        if not synthetic_ok:
            raise ValueError(f"--data-root: no CIFAR-10 found ({exc})") from None
        g = np.random.default_rng(work.seed)
        n = work.users * work.per_user
        tr_x = g.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        tr_y = g.integers(0, 10, n).astype(np.uint8)
        te_x = g.integers(0, 256, (work.test_size, 3, 32, 32), dtype=np.uint8)
        te_y = g.integers(0, 10, work.test_size).astype(np.uint8)
        source = "synthetic random images (no CIFAR-10 found)"
    need = work.users * work.per_user
    if need > len(tr_x):
        raise ValueError(f"workload: {work.users} users x {work.per_user} images need {need} "
                         f"training images, the data has {len(tr_x)}")
    order = np.random.default_rng(work.seed).permutation(len(tr_x))[:need]  # iid users
    x = tr_x[order]
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train_x.npy", x)
    np.save(folder / "train_y.npy", tr_y[order].astype(np.int64))
    np.save(folder / "test_x.npy", te_x[:work.test_size])
    np.save(folder / "test_y.npy", te_y[:work.test_size].astype(np.int64))
    scaled = x.astype(np.float64) / 255.0
    return {"mean": scaled.mean(axis=(0, 2, 3)).tolist(),
            "std": scaled.std(axis=(0, 2, 3)).tolist(), "source": source}


# --- running the frameworks -----------------------------------------------------------------


@dataclass
class Run:
    """One framework's run in one group, as its subprocess reported it."""

    framework: str
    label: str = ""
    iteration_s: list | None = None
    first_s: float | None = None
    startup_s: float | None = None
    accuracy: float | None = None
    peak_rss: int = 0
    versions: dict | None = None
    error: str | None = None
    to_target: dict | None = None  # TARGET_KEYS of its result, with --target


def row_precision(name: str) -> tuple[str, str | None]:
    """A row's name without its ``:bf16`` suffix, and that precision (None: ``--precision``)."""
    return (name[:-len(":bf16")], "bf16") if name.endswith(":bf16") else (name, None)


def parse_frameworks(text: str) -> list[str]:
    """``--engines`` for this workload: ``fedforge[:engine]``, ``pfl[:procs]``, ``flower``,
    ``plain``, each optionally with ``:bf16`` (that row in bf16 whatever ``--precision``
    says, so bf16 and fp32 rows share one interleaved run); a one-line ``ValueError`` naming
    the option otherwise."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--engines: no framework given")
    for name in names:
        base, _, engine = row_precision(name)[0].partition(":")
        if base not in FRAMEWORKS or (engine and engine not in ENGINES.get(base, ())):
            raise ValueError(f"--engines: unknown entry {name!r}; expected fedforge[:"
                             f"{'|'.join(FEDFORGE_ENGINES)}], pfl[:procs], flower or plain, each "
                             "optionally followed by :bf16")
    if len(set(names)) != len(names):
        raise ValueError(f"--engines: an entry is named twice in {text!r}")
    return names


def missing(framework: str, peer_python: str) -> str | None:
    """Why ``framework`` cannot run here ("not installed ..."), or None."""
    if framework == "pfl":
        probe = subprocess.run([peer_python, "-c", "import pfl, fedforge"],
                               capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            return f"not installed ({peer_python} cannot import pfl and fedforge; "\
                   f"{PFL_INSTALL})"
    if framework == "flower":
        from fedforge.bench.flower_w1 import INSTALL, flower_missing

        if (module := flower_missing()) is not None:
            return f"not installed (no module {module!r}; {INSTALL})"
    return None


def tree_memory(pid: int) -> int:
    """Memory of ``pid`` and all its descendants, from ``/proc``: the sum of their
    proportional set sizes (PSS: a page shared by k processes counts 1/k in each, so data in
    shared memory counts once), or of their RSS where PSS cannot be read; 0 where absent."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        total += _pss(p) or _rss(p, page)
    return total


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _rss(pid: int, page: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    except (OSError, IndexError, ValueError):
        return 0


POLL_S = 1.0  # memory polls: reading every process's smaps_rollup at 10 Hz took a quarter
# of a core from the timed run (more with Ray's many processes)


def launch(module: str, spec: dict, stem: Path, timeout_s: float,
           python: str = sys.executable, launcher: tuple[str, ...] = ("-m",)
           ) -> tuple[int, str | None]:
    """``python *launcher module STEM.spec.json STEM.out`` in a fresh process (``launcher``:
    ``-m``, or ``torchrun``'s arguments ending in its ``-m``), its output in ``STEM.log``,
    polling its process tree's memory every :data:`POLL_S` -> (peak bytes, why it failed or
    None)."""
    spec_path, out_path, log = (Path(f"{stem}.spec.json"), Path(f"{stem}.out"),
                                Path(f"{stem}.log"))
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "launched": time.time()}))
    with log.open("w") as err:
        proc = subprocess.Popen([python, *launcher, module, str(spec_path), str(out_path)],
                                stdout=err, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        peak, end = 0, time.monotonic() + timeout_s
        while proc.poll() is None:
            peak = max(peak, tree_memory(proc.pid))
            if time.monotonic() > end:
                proc.kill()
                proc.wait()
                return peak, f"failed: ran past {timeout_s:.0f} s"
            time.sleep(POLL_S)
    if proc.returncode != 0 or not out_path.is_file():
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        return peak, f"failed: {lines[-1][:160] if lines else proc.returncode}"
    return peak, None


def run_one(name: str, spec: dict, folder: Path, python: str, timeout_s: float) -> Run:
    """``name`` in a fresh subprocess of ``python``; polls its process tree's memory."""
    stem = folder / name.replace(":", "-")
    framework, precision = row_precision(name)
    peak, why = launch("fedforge.bench.pfl_cifar10_run",
                       {**spec, "framework": framework, "precision": precision
                        or spec["precision"]}, stem, timeout_s, python, launcher(framework))
    if why is not None:
        return Run(name, error=why)
    res = json.loads(Path(f"{stem}.out").read_text())
    to_target = {k: res[k] for k in TARGET_KEYS if k in res} or None
    return Run(name, res["label"], res["iteration_s"], res["first_s"], res["startup_s"],
               res["accuracy"], peak, res.get("versions", {}), to_target=to_target)


def launcher(framework: str) -> tuple[str, ...]:
    """How a row's process starts: ``python -m``, or for ``pfl:procs`` ``torchrun`` with one
    single-threaded process per core (torchrun sets one intra-op thread per process)."""
    if framework != "pfl:procs":
        return ("-m",)
    from fedforge.engine.procs import default_workers

    return ("-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={default_workers()}", "-m")


def run_pfl_cifar10(frameworks: list[str], out: Path, *, data_root: str | Path | None = None,
                    groups: int = 3, warmup: int = 1, iterations: int = 5, quick: bool = False,
                    precision: str = "fp32", peer_python: str | None = None,
                    timeout_s: float = 3600.0, target: float | None = None,
                    eval_every: int = 1, seed: int = 0
                    ) -> tuple[list[list[object]], str, dict[str, str]]:
    """Rows of :func:`header`, a note (workload, data) for the table and the versions the
    runs reported (the peers')."""
    if groups < 1 or warmup < 0 or iterations < 1:
        raise ValueError("--groups and --iterations must be at least 1, --warmup at least 0")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"--precision: expected fp32 or bf16, got {precision!r}")
    if target is not None and not 0 <= target <= 1:
        raise ValueError(f"--target: expected a test accuracy from 0 to 1, got {target}")
    if eval_every < 1:
        raise ValueError(f"--eval-every: expected at least 1, got {eval_every}")
    work = replace(QUICK if quick else PFL_CIFAR10, seed=seed)
    peer_python = peer_python or sys.executable
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work, data_root, out / "data", synthetic_ok=quick)
    spec = {"work": asdict(work), "data": str((out / "data").resolve()), "mean": data["mean"],
            "std": data["std"], "warmup": warmup, "iterations": iterations,
            "precision": precision, "target": target, "eval_every": eval_every}
    why = {f: missing(f, peer_python) for f in {n.partition(":")[0] for n in frameworks}}
    runs: dict[str, list[Run]] = {n: [] for n in frameworks}
    for g in range(groups):
        order = frameworks[g % len(frameworks):] + frameworks[:g % len(frameworks)]
        for name in order:
            base = name.partition(":")[0]
            if why[base] is None:
                python = peer_python if base == "pfl" else sys.executable
                runs[name].append(run_one(name, spec, out, python, timeout_s))
    rows = summarize(frameworks, runs, why, work, target is not None)
    mixed = " (rows ending in :bf16: bf16)" if any(row_precision(n)[1] for n in frameworks) \
        else ""
    versions: dict = {}
    for group in runs.values():
        for r in group:
            versions.update(r.versions or {})
    note = (f"Workload: {work.users} users x {work.per_user} images, cohort {work.cohort}, "
            f"{work.epochs} epoch of batch {work.batch} ({work.steps} steps), local lr "
            f"{work.local_lr}, FedAvg (central lr {work.central_lr}), {work.model}, "
            f"{precision}{mixed}; data: {data['source']}, test set {work.test_size}. Groups: "
            f"{groups}, each with {warmup} warm-up + {iterations} timed iterations per "
            f"framework in a fresh process, round-robin.")
    if target is not None:
        note += (f" Target: test accuracy {target}, evaluated every {eval_every} iterations "
                 "from the first (warm-up included), outside the timed region.")
    return rows, note, dict(sorted(versions.items()))


def header(target: bool) -> list[str]:
    """The table's columns: :data:`HEADER`, then with a target :data:`TARGET_HEADER`."""
    return HEADER + TARGET_HEADER if target else list(HEADER)


def summarize(frameworks: list[str], runs: dict[str, list[Run]], why: dict,
              work: Workload, target: bool = False) -> list[list[object]]:
    """One row per framework: medians over its groups' timed iterations, the peak memory
    over its groups; ratios to the first fedforge row that ran; with a target, its
    :func:`target_cells`."""
    width = len(header(target))
    stats: dict[str, dict] = {}
    for name in frameworks:
        ok = [r for r in runs[name] if r.error is None]
        if ok:
            stats[name] = {
                "label": ok[-1].label,
                "it": statistics.median(t for r in ok for t in r.iteration_s or []),
                "start": statistics.median(r.startup_s for r in ok),
                "first": statistics.median(r.first_s for r in ok),
                "rss": max(r.peak_rss for r in ok) / 2**20,
                "acc": statistics.median(r.accuracy for r in ok),
                "target": target_cells(ok) if target else []}
    ref = next((stats[n] for n in frameworks if n.startswith("fedforge") and n in stats), None)
    rows: list[list[object]] = []
    for name in frameworks:
        if name not in stats:
            base = name.partition(":")[0]
            errors = [r.error for r in runs[name] if r.error]
            reason = why.get(base) or (errors[0] if errors else "not run")
            rows.append([name, reason] + [None] * (width - 2))
            continue
        s = stats[name]

        def ratio(key: str, s=s) -> float | None:
            return None if ref is None or not ref[key] else round(s[key] / ref[key], 2)

        rows.append([name, s["label"], round(s["it"], 3), round(work.cohort / s["it"], 1),
                     round(s["start"], 2), round(s["first"], 2), round(s["rss"]),
                     round(s["acc"], 4), ratio("it"), ratio("start"), ratio("rss")]
                    + s["target"])
    return rows


def target_cells(ok: list[Run]) -> list[object]:
    """A row's "iterations to target" and "s to target": medians over its groups, a group
    that never reached the target counting as infinitely many, so that a median beyond the
    run is censored (:func:`censored`)."""
    runs = [r.to_target for r in ok if r.to_target]
    if not runs:
        return [None, None]

    def median(key: str) -> float:
        return statistics.median(math.inf if r[key] is None else r[key] for r in runs)

    its, secs = median("iterations_to_target"), median("s_to_target")
    return [censored(its if math.isinf(its) or its % 1 else int(its),
                     max(r["iterations_run"] for r in runs)),
            censored(round(secs, 2), round(median("trained_s"), 2))]


def censored(value: float, bound: float) -> object:
    """A time-to-target cell: ``value``, or "≥ bound" where it is infinite (the target was
    not reached in the ``bound`` iterations or seconds run: all we know is more)."""
    return f"≥ {bound}" if math.isinf(value) else value


def bf16_check(cells: dict[str, object]) -> list[str]:
    """One line per framework that has an fp32 and a bf16 row (``name`` and ``name:bf16``)
    in ``cells`` (row name -> its "iterations to target" cell: a number, a censored "≥ N"
    or None where the row has no result): whether bf16 needed more iterations than fp32.
    bf16 computes in lower precision; this says whether that cost convergence."""
    lines = []
    for name, b in cells.items():
        base, precision = row_precision(name)
        if precision is None or base not in cells:
            continue
        f, head = cells[base], f"bf16 iterations to target: {base}"
        if b is None or f is None:
            lines.append(f"{head}: no {'bf16' if b is None else 'fp32'} result, not compared")
            continue
        bv, fv = (math.inf if isinstance(c, str) else c for c in (b, f))
        if math.isinf(bv) and math.isinf(fv):
            lines.append(f"{head} {b} vs fp32 {f}: neither reached the target, not compared")
        elif bv <= fv:
            lines.append(f"{head} {b} vs fp32 {f} (not more)")
        else:
            lines.append(f"{head} {b} vs fp32 {f}: MORE iterations in bf16")
    return lines


# ----------------------------------------------------------- fedforge bench pfl-cifar10

Engines = Annotated[str, typer.Option(
    help="fedforge (engine auto) or fedforge:loop|vmap|procs, pfl (one process) or pfl:procs "
         "(torchrun, one process per core), flower, plain, each optionally ending in :bf16 "
         "(that row in bf16)")]
Quick = Annotated[bool, typer.Option(
    "--quick", help="a tiny workload (16 users, cohort 4), random images when CIFAR-10 is "
                    "absent: checks that every row runs")]
Precision = Annotated[str, typer.Option(
    help="fp32 | bf16 (autocast, fp32 weights) for every framework")]
PeerPython = Annotated[str | None, typer.Option(
    help="the Python that runs pfl-research (one with pfl installed that can import "
         "fedforge); default this one")]
Target = Annotated[float | None, typer.Option(
    help="test accuracy to reach: adds the columns 'iterations to target' and 's to "
         "target', and under the table whether bf16 rows needed more iterations than fp32")]
EvalEvery = Annotated[int, typer.Option(
    "--eval-every", help="with --target: evaluate every K iterations, warm-up included "
                         "(outside the timed region)")]
DataRoot = Annotated[Path | None, typer.Option(
    "--data-root", help="folder holding the dataset folders (wins over $FEDFORGE_DATA)")]
Seed = Annotated[int, typer.Option(
    help="the workload's seed: initial weights, users' images, cohorts and dropout keys "
         "(every framework the same); another seed is another sample of the accuracy")]


def pfl_cifar10(engines: Engines = "fedforge,pfl,pfl:procs,flower,plain", groups: Groups = 3,
                warmup: Warmup = 1, iterations: Iterations = 5, quick: Quick = False,
                precision: Precision = "fp32", peer_python: PeerPython = None,
                data_root: DataRoot = None, out: Out = "runs/bench_pfl_cifar10",
                results: Results = None, target: Target = None, eval_every: EvalEvery = 1,
                seed: Seed = 0) -> str:
    """pfl-research's CIFAR-10 workload: fedforge, pfl-research, Flower and a plain loop,
    interleaved."""

    from fedforge.bench.op_counts import op_count_note
    from fedforge.bench.results import record_results, run_info
    from fedforge.data.root import use_data_root_option

    folder, results = folders(out, results)
    load_before = os.getloadavg()
    if data_root is not None:
        use_data_root_option(data_root)
    frameworks = parse_frameworks(engines)
    rows, note, versions = run_pfl_cifar10(frameworks, folder, groups=groups, warmup=warmup,
                                           iterations=iterations, quick=quick,
                                           precision=precision, peer_python=peer_python,
                                           target=target, eval_every=eval_every, seed=seed)
    title = ("pfl-research CIFAR-10 (simple_cnn, FedAvg)" + (", --quick" if quick else "")
             + (f", seed {seed}" if seed else ""))
    counts = op_count_note(precision)  # counted, not timed: the same on a loaded machine
    print(counts, flush=True)
    # under the table, with the notes: rows without a result have None in the column
    checks = [] if target is None else bf16_check({r[0]: r[len(HEADER)] for r in rows})
    return record_results(results, "pfl-cifar10", variant(frameworks, precision, quick),
                          title, header(target is not None), rows,
                          run_info("cpu", load_before, versions=versions),
                          [note, *checks, counts])


def variant(frameworks: list[str], precision: str, quick: bool) -> str:
    """Which table a run is: ``bf16`` when every fedforge row runs in bf16, else ``fp32``;
    ``-quick`` for the tiny workload."""
    ours = [n for n in frameworks if n.startswith("fedforge")]
    bf16 = precision == "bf16" or bool(ours) and all(row_precision(n)[1] for n in ours)
    return ("bf16" if bf16 else "fp32") + ("-quick" if quick else "")
