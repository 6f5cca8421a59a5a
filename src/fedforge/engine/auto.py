"""AutoEngine (``engine.name = "auto"``): pick the fastest engine for this run by timing it.

Which engine is fastest depends on the model and the machine: on a CPU the vmapped engine
wins where per-client overhead dominates (small dense models) and can lose where one client's
convolutions already keep the cores busy. On its first cohort the engine times a few chunks
of that cohort with each candidate — the loop, the vmapped engine at its automatic chunk
size and at half of it, each with functorch's convolutions and with the per-shape batched
ones (:mod:`fedforge.engine.batched_conv`) — keeps the fastest and runs every cohort with it.
On a CPU a model with 2-D convolutions also has the channels-last loop ("loop channels_last":
images and conv weights in NHWC memory format, which can spare oneDNN's layout reorders and
use the NHWC pooling kernels, or lose to the plain loop; its results leave the engine in the
ordinary layout).
On a CPU, with two or more threads and worker processes allowed (``allow_processes``: the
``fedforge`` command allows them, the Python API only when asked), it then times the loop
(and a vmapped winner) split over single-threaded worker processes
(:class:`~fedforge.engine.procs.ProcessEngine`, one per thread; such processes beat one
multi-threaded process on the machines measured), timed by the best of two calls, and keeps
whichever is fastest. The workers' start-up counts against the calibration's share, which the
in-process candidates leave them for a conv net.
The calibration's results are thrown away (the local update is pure), so the run trains
exactly as the chosen engine alone would.
A calibration that ran while another job came or went can pick wrongly, so the engine
watches its pick until a checkpoint records it: when ``DRIFT_COHORTS`` cohorts in a row of at
least ``DRIFT_MIN_S`` take ``DRIFT_FACTOR`` times longer or shorter per client update than
calibration measured, it calibrates once more (at most ``MAX_RECHECKS`` times a run) and runs
on with the new pick. A pick that a checkpoint holds never changes, so every resume runs the
engine the uninterrupted run ran from that round on, and stays bit-exact.

Calibration only runs when it costs at most ``max_share`` (2 %) of the run's client updates
(``budget_updates``, set by the runner to rounds x clients per round), and it skips the
remaining candidates once the next would overrun that share of the projected run (keeping
what timing the worker processes needs for them). A shorter run of a model with
convolutions on a CPU, where worker processes are allowed, times the loop on one client and
then the loop in worker processes when their start-up and timing cost at most
``PROCESS_TRIAL_SHARE`` (10 %) of the run projected at the loop's speed, and keeps the
faster (a 3-round run keeps the loop; vmapped convolutions lose to the loop there,
``benchmarks/RESULTS.md``). Other short runs take a measured default: on a CPU, a model with
convolutions runs the loop, and so does a model whose one client's step keeps at least
``LOOP_ACTIVATION_BYTES`` of activations (its matmuls already have many rows: vmapping
such clients only adds memory traffic); any other model runs the vmapped engine. The choice and
the per-layer convolution strategies are :meth:`state_dict`, stored in every checkpoint, so a
resumed run reuses them and stays bit-exact.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from fedforge.engine.activations import saved_activation_bytes
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput
from fedforge.engine.local import LossFn
from fedforge.engine.loop import LoopEngine, loop_label
from fedforge.engine.procs import ProcessEngine, default_workers
from fedforge.engine.vmap import VmapEngine

logger = logging.getLogger(__name__)
MAX_SHARE = 0.02  # calibration may cost at most this share of the run
PROCESS_START_S = 3.0  # starting worker processes (spawn, import torch, share the data)
# an uncalibrated CPU conv net runs in worker processes from this many client updates on:
# they beat the loop in every measurement (benchmarks/RESULTS.md), and start in 1.5-3 s
PROCESS_MIN_UPDATES = 1000
# clients per worker when timing the loop in processes: with one, the per-call cost (sending
# the model, collecting the shard) made them look slower than they run (LeNet-5, 2026-11-26)
PROCESS_LOOP_CLIENTS = 4
# ... and at least this many seconds of each worker's training per timed call: for a fast
# model the per-call cost is otherwise a large share of the timing and none of the run's
# (text classifier, 5 ms per update: 5.1 or 6.0 ms per update in processes from 4 clients
# each, so the loop in processes lost one calibration it wins in the run, 2026-11-26)
PROCESS_MIN_CALL_S = 0.1
# worker processes are timed by the best of this many calls after the warm-up: one call of a
# few clients per worker is a fraction of a second, and one slow moment of the machine decided
# a pick (LeNet-5, cohort 100: the loop in processes timed 30.8 ms per update in one
# calibration and 21.5 ms in the next, the plain floor's steady rate being 20-25 ms)
PROCESS_TIMED_CALLS = 2
# a vmapped chunk in worker processes replaces the loop in them only when it times at least
# this much faster: the two are within the calibration's noise on a conv net, and the vmapped
# one lost the run (pfl-research's CIFAR-10 workload, fp32, 2-core AVX-512-BF16 EPYC,
# 2026-12-03: it timed 63.9 against 72.2 ms per update and ran 3.69 s an iteration, where the
# loop in processes ran 2.85-3.02 s); a small dense model's vmapped win is several times
PROCESS_VMAP_MARGIN = 0.15
# worker processes replace an in-process winner even when they time up to this much slower:
# a short calibration cannot separate them closer than that, and processes hold up under
# contention (1.5-5x a 2-thread loop under load). W1's CNN on a 2-core AVX2 EPYC (2026-12-03):
# the loop in processes timed 297 and 276 ms per update against the in-process loop's 264 and
# 269 at cohorts 10 and 100, and the in-process loop then ran 2.3 and 2.6 updates/s where
# two plain processes ran 3.8 and 3.4
PROCESS_PREFERENCE = 0.15
# a run too short for the full calibration still times the loop on one client and, where
# worker processes are allowed, the loop in processes when their start-up and timing fit in
# this share of the run projected at the loop's speed (otherwise the loop runs): a 3-round
# run of a conv net never starts them, a long one measures rather than assumes that they win
PROCESS_TRIAL_SHARE = 0.1
# an uncalibrated model without convolutions runs the loop on a CPU from this many bytes of
# one client's step activations on: on a 2-core AVX2 EPYC (2026-12-02, W1 text shapes, cohort
# 10) the vmapped engine lost to the loop on transformer_tiny (27 MiB: 3.29 against 3.70
# updates/s) and transformer_lm (80 MiB: 1.11 against 1.25), and on MiniLM with LoRA (154 MiB,
# 16 x 64 tokens: 0.58-0.78x the plain loop, `fedforge bench lora`); it wins where a step is
# tiny (the MLP, 0.1 MiB)
LOOP_ACTIVATION_BYTES = 16 * 2**20
# a pick is calibrated again when this many cohorts in a row ran this factor slower or faster
# per update than calibration timed it: a passing load decided a pick (pfl-research's CIFAR-10
# workload in bf16, 2026-11-28: vmap, picked under load, ran 3.2-3.4 s an iteration once the
# load had gone, where two worker processes ran 2.4 s)
DRIFT_FACTOR = 2.0
DRIFT_COHORTS = 3
DRIFT_MIN_S = 1.0  # shorter cohorts are not compared: their times are mostly noise
MAX_RECHECKS = 1


def loop_clients_per_worker(ms_per_update: float) -> int:
    """Clients per worker when timing the loop in processes (see the two constants above)."""
    if not ms_per_update > 0:  # nothing timed yet
        return PROCESS_LOOP_CLIENTS
    return max(PROCESS_LOOP_CLIENTS, math.ceil(1000.0 * PROCESS_MIN_CALL_S / ms_per_update))


def _process_factor(inner: str, best: dict) -> float:
    """How fast, relative to ``best``'s time, a candidate in worker processes running
    ``inner`` must time to replace it: a vmapped chunk replacing the loop in processes needs
    :data:`PROCESS_VMAP_MARGIN`; processes replacing an in-process winner may be
    :data:`PROCESS_PREFERENCE` slower."""
    if best["engine"] != "procs":
        return 1.0 + PROCESS_PREFERENCE
    if inner == "vmap" and best.get("inner") == "loop":
        return 1.0 - PROCESS_VMAP_MARGIN
    return 1.0


def _label(choice: dict) -> str:
    if choice["engine"] == "procs":
        inner = _label({**choice, "engine": choice["inner"]})
        return f"procs {choice['workers']} x {inner}"
    if choice["engine"] == "loop":
        return loop_label(choice.get("conv") == "channels_last")
    return f"vmap chunk {choice['chunk']} conv {choice['conv']}"


def process_workers(x_all: torch.Tensor) -> int:
    """How many single-threaded worker processes ``auto`` may try where they are allowed:
    the intra-op threads this process was given (``OMP_NUM_THREADS``,
    ``torch.set_num_threads``), capped by the usable CPUs; 0 off the CPU."""
    if x_all.device.type != "cpu":
        return 0
    return min(torch.get_num_threads(), default_workers())


def _ms_per_update(engine: ChunkedEngine, algorithm, loss_fn, x_all: torch.Tensor,
                   y_all: torch.Tensor, sub: CohortInputs, timed: int = 1) -> float:
    """A warm-up call (plans, compiled chunks, worker start-up), then ``timed`` timed ones ->
    the fastest one's milliseconds per client update."""
    engine.run_cohort(algorithm, loss_fn, x_all, y_all, sub)
    best = float("inf")
    for _ in range(timed):
        t0 = time.perf_counter()
        engine.run_cohort(algorithm, loss_fn, x_all, y_all, sub)
        best = min(best, time.perf_counter() - t0)
    return best * 1000.0 / sub.sample_idx.shape[0]


def _has_conv(params) -> bool:
    """A convolution's weight has three or more dimensions; linear, norm and RNN ones fewer."""
    return any(p.dim() >= 3 for p in params.values())


def _has_conv2d(params) -> bool:
    """A 2-D convolution's weight is 4-D: what the channels-last loop changes the layout of."""
    return any(p.dim() == 4 for p in params.values())


class AutoEngine(ChunkedEngine):
    """Times candidate engines on the first cohort and runs the fastest (module docstring)."""

    name = "auto"

    def __init__(
        self,
        chunk_size: int | str = "auto",
        *,
        compile: bool | str = False,
        keep_deltas: bool = False,
        budget_updates: int | None = None,
        max_share: float | None = None,
        allow_processes: bool = False,
    ) -> None:
        super().__init__(keep_deltas=keep_deltas)
        self.allow_processes = allow_processes  # may it start worker processes (see above)
        self._chunk = chunk_size
        self.compile = compile
        self.budget_updates = budget_updates
        self.max_share = MAX_SHARE if max_share is None else max_share
        self.choice: dict | None = None  # {"engine", "chunk", "conv"}
        self.timings: dict[str, float] = {}  # candidate label -> ms per client update
        self.calibration_s = 0.0
        self.engine: ChunkedEngine | None = None
        self._reported = False
        self.rechecks = 0  # calibrations after the first (see DRIFT_FACTOR)
        self._recorded = False  # a checkpoint holds the pick: it no longer changes
        self._drift: list[float] = []  # recent cohorts' time per update / calibration's

    # --- what runs ------------------------------------------------------------------------
    def build(self, choice: dict) -> ChunkedEngine:
        """The engine a choice names: the loop (conv ``native`` or ``channels_last``), vmap
        with chunk and conv, or worker processes running the loop or vmap."""
        if choice.get("engine") == "procs":
            inner = choice.get("inner")
            if inner not in ("loop", "vmap"):
                raise ValueError(f"engine auto: unknown recorded procs inner engine {inner!r}")
            conv = choice.get("conv", "native")
            if conv not in ("native", "channels_last") or (inner == "vmap" and conv != "native"):
                raise ValueError(f"engine auto: unknown recorded procs conv {conv!r}")
            return ProcessEngine(keep_deltas=self.keep_deltas, workers=choice.get("workers"),
                                 inner=inner, chunk_size=choice.get("chunk", "auto"),
                                 channels_last=conv == "channels_last")
        if choice.get("engine") == "loop":
            conv = choice.get("conv", "native")
            if conv not in ("native", "channels_last"):
                raise ValueError(f"engine auto: unknown recorded loop conv {conv!r}")
            return LoopEngine(keep_deltas=self.keep_deltas,
                              channels_last=conv == "channels_last")
        if choice.get("engine") != "vmap":
            raise ValueError(f"engine auto: unknown recorded engine {choice.get('engine')!r}")
        return VmapEngine(chunk_size=choice.get("chunk", "auto"), compile=self.compile,
                          conv=choice.get("conv", "native"), keep_deltas=self.keep_deltas)

    def run_cohort(self, algorithm, loss_fn, x_all, y_all, inputs: CohortInputs) -> CohortOutput:
        if self.engine is None:
            self._choose(algorithm, loss_fn, x_all, y_all, inputs)
        assert self.engine is not None
        self.engine.keep_deltas = self.keep_deltas
        t0 = time.perf_counter()
        out = self.engine.run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
        self.watch(time.perf_counter() - t0, inputs.sample_idx.shape[0])
        return out

    def watch(self, seconds: float, clients: int) -> None:
        """Compare a cohort's time with what calibration timed for the pick; after
        ``DRIFT_COHORTS`` cohorts off by ``DRIFT_FACTOR`` (either way), drop the pick so that
        the next cohort calibrates again. Not once a checkpoint holds the pick."""
        timed = self.timings.get(_label(self.choice)) if self.choice else None
        if (not timed or self._recorded or self.rechecks >= MAX_RECHECKS or clients < 1
                or seconds < DRIFT_MIN_S):
            return
        ratio = seconds * 1000.0 / clients / timed
        self._drift = [*self._drift[1 - DRIFT_COHORTS:], ratio]
        if len(self._drift) < DRIFT_COHORTS:
            return
        if min(self._drift) > DRIFT_FACTOR or max(self._drift) < 1.0 / DRIFT_FACTOR:
            logger.info("engine auto: %s ran %s x its calibrated time per update; "
                        "calibrating again", _label(self.choice),
                        [round(r, 2) for r in self._drift])
            self.rechecks += 1
            self._drift = []
            self.engine.close()
            self.engine, self.choice, self.timings = None, None, {}
            self._reported = False  # the run's metrics get the new pick

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def chunk_size(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        return (self.engine or VmapEngine(self._chunk)).chunk_size(inputs, x_all, y_all, loss_fn)

    # --- calibration ----------------------------------------------------------------------
    def _workers(self, x_all: torch.Tensor) -> int:
        """Worker processes this engine may try: none unless they are allowed."""
        return process_workers(x_all) if self.allow_processes else 0

    def candidates(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None
                   ) -> list[dict]:
        """Loop (and on a CPU, for a 2-D conv net, the channels-last loop), then vmap at the
        automatic chunk ``a`` (its activations measured when the loss is given) and ``a // 2``,
        each with native and batched convolutions (chunks capped at the cohort size)."""
        num = inputs.sample_idx.shape[0]
        a = min(VmapEngine(self._chunk).chunk_size(inputs, x_all, y_all, loss_fn), num)
        chunks = [a] if self._chunk != "auto" or a < 4 else [a, a // 2]
        out = [{"engine": "loop", "chunk": 1, "conv": "native"}]
        if x_all.device.type == "cpu" and _has_conv2d(inputs.global_params):
            out.append({"engine": "loop", "chunk": 1, "conv": "channels_last"})
        for c in chunks:
            out += [{"engine": "vmap", "chunk": c, "conv": conv} for conv in ("native", "auto")]
        return out

    def _default(self, inputs, x_all, reason: str, y_all=None, loss_fn=None) -> None:
        cpu = x_all.device.type == "cpu"
        if cpu and _has_conv(inputs.global_params):
            self.choice = {"engine": "loop", "chunk": 1, "conv": "native"}
            workers = self._workers(x_all)
            if workers >= 2 and (self.budget_updates or 0) >= PROCESS_MIN_UPDATES:
                self.choice = {"engine": "procs", "inner": "loop", "chunk": 1,
                               "conv": "native", "workers": workers}
        elif cpu and self._step_activations(inputs, x_all, y_all, loss_fn) >= LOOP_ACTIVATION_BYTES:
            self.choice = {"engine": "loop", "chunk": 1, "conv": "native"}
        else:
            self.choice = {"engine": "vmap", "chunk": self._chunk, "conv": "native"}
        self.choice.update(calibrated=False, reason=reason)
        self.engine = self.build(self.choice)
        logger.info("engine auto: %s, uncalibrated (%s)", _label(self.choice), reason)

    @staticmethod
    def _step_activations(inputs: CohortInputs, x_all, y_all, loss_fn) -> int:
        """Bytes one client's step keeps for its backward pass (0 when they cannot be
        measured: no loss or no batch given)."""
        if loss_fn is None or y_all is None or not inputs.sample_idx.numel():
            return 0
        idx = inputs.sample_idx[0, 0]
        return saved_activation_bytes(loss_fn, inputs.global_params, x_all[idx], y_all[idx],
                                      inputs.weights[0, 0])

    def _choose(self, algorithm, loss_fn, x_all, y_all, inputs: CohortInputs) -> None:
        if self.compile:
            return self._default(inputs, x_all, "engine.compile is set")
        cands = self.candidates(inputs, x_all, y_all, loss_fn)
        cost = sum(2 * c["chunk"] for c in cands)  # client updates: a warm-up and a timed chunk
        if self.budget_updates is None or cost > self.max_share * self.budget_updates:
            reason = (f"run too short to calibrate ({cost} client updates > "
                      f"{self.max_share:.0%} of {self.budget_updates})")
            return self._short_run(algorithm, loss_fn, x_all, y_all, inputs, reason)
        t_start = time.perf_counter()
        best, best_ms = None, float("inf")
        workers = self._workers(x_all)
        # keep the processes' share only for a CPU conv net, where they won every measurement
        reserve_for = workers if _has_conv(inputs.global_params) else 0
        last_s = 0.0  # how long the previous candidate took
        for cand in cands:
            left = (self._share_s(best_ms)
                    - self._process_reserve_s(reserve_for, self._fastest_loop(best_ms)[1])
                    - (time.perf_counter() - t_start))
            if best is not None and last_s > left:
                break  # the next candidate would overrun the share: keep the best so far
            engine = self.build(cand)
            t_cand = time.perf_counter()
            ms = _ms_per_update(engine, algorithm, loss_fn, x_all, y_all,
                                inputs.clients(slice(0, cand["chunk"])))
            last_s = time.perf_counter() - t_cand
            if cand["conv"] == "auto" and not engine.state_dict().get("conv_plans"):
                continue  # no convolution in this model: same as native
            self.timings[_label(cand)] = round(ms, 3)
            if ms < best_ms:
                best, best_ms = (cand, engine), ms
        assert best is not None
        if workers >= 2:
            best, best_ms = self._time_processes(algorithm, loss_fn, x_all, y_all, inputs,
                                                 best, best_ms, workers, t_start,
                                                 reserved=reserve_for > 0)
        self.calibration_s = time.perf_counter() - t_start
        self.choice = {**best[0], "calibrated": True}
        self.engine = best[1]
        logger.info("engine auto: %s (ms per client update: %s; %.1f s)", _label(best[0]),
                    self.timings, self.calibration_s)

    def _short_run(self, algorithm, loss_fn, x_all, y_all, inputs: CohortInputs,
                   reason: str) -> None:
        """A run too short for the full calibration (``PROCESS_TRIAL_SHARE``): a CPU conv net
        whose run may start worker processes times the loop on one client, then the loop in
        processes if that fits the share, and keeps the faster; anything else takes
        :meth:`_default`."""
        workers = self._workers(x_all)
        if (not self.budget_updates or workers < 2 or x_all.device.type != "cpu"
                or not _has_conv(inputs.global_params)):
            return self._default(inputs, x_all, reason, y_all, loss_fn)
        t_start = time.perf_counter()
        cand = {"engine": "loop", "chunk": 1, "conv": "native"}
        engine = self.build(cand)
        ms = _ms_per_update(engine, algorithm, loss_fn, x_all, y_all, inputs.clients(slice(0, 1)))
        self.timings[_label(cand)] = round(ms, 3)
        allowed = PROCESS_TRIAL_SHARE * ms / 1000.0 * self.budget_updates
        best, _ = self._time_processes(algorithm, loss_fn, x_all, y_all, inputs, (cand, engine),
                                       ms, workers, t_start, allowed=allowed)
        self.calibration_s = time.perf_counter() - t_start
        self.choice = {**best[0], "calibrated": True, "reason": reason}
        self.engine = best[1]
        logger.info("engine auto: %s (short run: ms per client update: %s; %.1f s)",
                    _label(best[0]), self.timings, self.calibration_s)

    def _time_processes(self, algorithm, loss_fn, x_all, y_all, inputs: CohortInputs,
                        best: tuple, best_ms: float, workers: int, t_start: float,
                        allowed: float | None = None, reserved: bool = False) -> tuple:
        """The loop (and a vmap winner at its chunk) split over ``workers`` single-threaded
        processes, each running a few clients (the loop) or one chunk (vmap), against the
        in-process winner -> the fastest (choice, engine) and its time. The workers' loop
        takes the layout that won in this process (channels-last or not). ``allowed``:
        seconds the calibration may take in all (default: its share of the run).
        A candidate in processes wins by :func:`_process_factor`. ``reserved``: the in-process
        candidates left the loop in processes its share, so it is timed even where one of them
        overran (a vmapped candidate planning its convolutions
        took longer than the one before it, and LeNet-5 at cohort 10 kept the in-process
        loop at 0.82x the plain floor of two processes)."""
        loop_conv, loop_ms = self._fastest_loop(best_ms)
        inners = [("loop", 1, loop_conv)]
        if best[0]["engine"] == "vmap" and best[0]["conv"] == "native":  # conv plans stay here
            inners.append(("vmap", best[0]["chunk"], "native"))
        allowed = self._share_s(best_ms) if allowed is None else allowed
        for inner, chunk, conv in inners:
            per_worker = loop_clients_per_worker(loop_ms) if inner == "loop" else chunk
            clients = min(workers * per_worker, inputs.sample_idx.shape[0])
            over = time.perf_counter() - t_start + PROCESS_START_S > allowed
            if clients < 2 or (over and not (reserved and inner == "loop")):
                break
            cand = {"engine": "procs", "inner": inner, "chunk": chunk, "conv": conv,
                    "workers": workers}
            engine = self.build(cand)  # its warm-up call starts the workers
            ms = _ms_per_update(engine, algorithm, loss_fn, x_all, y_all,
                                inputs.clients(slice(0, clients)), PROCESS_TIMED_CALLS)
            if engine.fallback is None:
                self.timings[_label(cand)] = round(ms, 3)
            if engine.fallback is None and ms < best_ms * _process_factor(inner, best[0]):
                best[1].close()
                best, best_ms = (cand, engine), ms
            else:
                engine.close()
        return best, best_ms

    def _fastest_loop(self, untimed_ms: float) -> tuple[str, float]:
        """The in-process loop's faster timed layout and its ms per update (native on a tie;
        native at ``untimed_ms`` before the loop is timed): what the workers' loop runs and
        is sized by."""
        timed = [(c, self.timings[k]) for c in ("native", "channels_last")
                 if (k := _label({"engine": "loop", "conv": c})) in self.timings]
        return min(timed, key=lambda t: t[1]) if timed else ("native", untimed_ms)

    @staticmethod
    def _process_reserve_s(workers: int, loop_ms: float) -> float:
        """What timing the loop in worker processes needs of the share (0 without them):
        their start-up, a warm-up and ``PROCESS_TIMED_CALLS`` timed calls of their clients at
        ``loop_ms`` each, so the in-process candidates cannot spend it first (processes won
        every CPU measurement of a conv net)."""
        if workers < 2:
            return 0.0
        calls = 1 + PROCESS_TIMED_CALLS
        return PROCESS_START_S + calls * loop_clients_per_worker(loop_ms) * loop_ms / 1000.0

    def _share_s(self, best_ms: float) -> float:
        """Seconds calibration may take: its share of the run projected at ``best_ms``."""
        return self.max_share * best_ms / 1000.0 * self.budget_updates

    # --- records --------------------------------------------------------------------------
    def report(self) -> dict:
        """Once: the choice for the run's metrics, with the timings or why there were none."""
        if self._reported or self.choice is None:
            return {}
        self._reported = True
        if not self.choice.get("calibrated"):
            return {"engine_auto": _label(self.choice),
                    "engine_auto_reason": self.choice.get("reason", "")}
        return {"engine_auto": _label(self.choice), "engine_auto_ms": dict(self.timings),
                "engine_auto_calibration_s": round(self.calibration_s, 3),
                **({"engine_auto_rechecks": self.rechecks} if self.rechecks else {})}

    def state_dict(self) -> dict:
        rechecks = {"rechecks": self.rechecks} if self.rechecks else {}
        if self.choice is None:  # before the first calibration, or dropped for another
            return rechecks
        self._recorded = True  # a checkpoint holds it from now on (see DRIFT_FACTOR)
        inner = self.engine.state_dict() if self.engine is not None else {}
        return {"choice": dict(self.choice), "timings": dict(self.timings), **rechecks, **inner}

    def load_state_dict(self, state: dict) -> None:
        """Reuse a recorded choice (resume): no calibration, same per-layer strategies."""
        self.rechecks = int(state.get("rechecks", 0))
        if not state.get("choice"):
            return
        if not isinstance(state["choice"], dict):
            raise ValueError("checkpoint field 'engine.choice' is not a table")
        if state["choice"].get("engine") == "procs" and not self.allow_processes:
            raise ValueError("checkpoint field 'engine.choice': this run chose worker processes "
                             f"({_label(state['choice'])}); resume it from the fedforge command "
                             "or with allow_processes=True")
        self.choice = dict(state["choice"])
        self.timings = dict(state.get("timings", {}))
        self._reported = self._recorded = True  # the run's metrics already hold it
        self.engine = self.build(self.choice)
        self.engine.load_state_dict(state)
