"""ProcessEngine: the cohort split over worker processes equals the loop in one process.

Spawning a worker costs seconds (a new interpreter imports torch), so the tests that need
workers share one module-scoped two-worker engine; that every registered algorithm then runs
on it (a slow test) also exercises the workers' cache of (algorithm, loss) pairs.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import signal
import threading

import pytest
import torch
from safetensors.torch import load_file

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, ProcessEngine, build_engine, classification_loss
from fedforge.engine.base import CohortInputs
from fedforge.engine.draw import RoundDraw
from fedforge.engine.procs import default_workers, pickle_for_workers
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.config import EngineConfig
from fedforge.experiment.runner import run_experiment
from fedforge.models import build_model
from fedforge.robust import Attack, RobustRound, build_aggregator
from fedforge.study.labels import without_wall_clock
from tests.engine.test_parity import (
    CLIENTS,
    MODELS,
    NUM_CLASSES,
    _data,
    _hparams,
    _run,
    assert_same_run,
)
from tests.experiment.test_runner import _cfg

SHAPE, KWARGS, KIND = MODELS["mlp"]


def _model():
    torch.manual_seed(0)
    return build_model("mlp", SHAPE, NUM_CLASSES, **KWARGS)


@pytest.fixture(scope="module")
def engine():
    with ProcessEngine(workers=2) as eng:
        yield eng
    assert eng.processes == []


@pytest.mark.slow  # two spawned interpreters plus every algorithm twice: about a minute
@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_every_algorithm_equals_the_loop_in_one_process(engine, algo_name):
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    pairs = len(engine._tokens)
    got = _run(algorithm, engine, model, x, y, sample_idx, weights)
    assert engine.fallback is None and len(engine.processes) == 2  # it ran in the workers
    assert_same_run(ref, got, rtol=1e-4)
    # one (algorithm, loss) pair for both rounds: sent once, then found in the workers' cache
    assert len(engine._tokens) == pairs + 1
    described = engine.describe()
    assert [(d["threads"], d["interop"]) for d in described] == [(1, 1)] * 2
    assert all(d["pairs"] == sorted(engine._loaded) for d in described)


@pytest.mark.slow  # spawns two workers
def test_channels_last_workers_equal_the_loop_in_one_process():
    """The workers' loop in NHWC layout (a 2-D conv net): same round as the plain loop, and
    the layout is reported with the inner engine."""
    from tests.engine.test_batched_conv import LENET_LIKE

    name, shape, kwargs = LENET_LIKE
    torch.manual_seed(0)
    model = build_model(name, shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data("image", shape)
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    with ProcessEngine(workers=2, channels_last=True) as eng:
        got = _run(algorithm, eng, model, x, y, sample_idx, weights)
        assert eng.fallback is None and len(eng.processes) == 2
        assert eng.report()["engine_procs_inner"] == "loop channels_last"
    assert_same_run(ref, got, rtol=1e-4)


def _inputs(x, sample_idx, weights, params, num=CLIENTS) -> CohortInputs:
    return CohortInputs(params, {"round": torch.tensor(1.0)}, {}, {}, sample_idx[:num],
                        weights[:num], torch.full((num,), 1.0 / num))


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


class _FailsInWorkers:
    """The loss, except in a worker process, where it raises."""

    def __init__(self, model):
        self.loss = classification_loss(model)

    def __call__(self, *args):
        if mp.parent_process() is not None:
            raise FloatingPointError("diverged in a worker")
        return self.loss(*args)


def test_worker_error_carries_its_traceback_and_the_engine_goes_on(engine):
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    inputs = _inputs(x, sample_idx, weights, _params(model))
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    with pytest.raises(RuntimeError) as err:
        engine.run_cohort(algorithm, _FailsInWorkers(model), x, y, inputs)
    header, *rest = str(err.value).splitlines()
    assert header.startswith("procs engine worker ") and header.endswith("failed in 'run':")
    assert rest[0].startswith("Traceback") and "FloatingPointError: diverged in a worker" in rest
    # every reply was read: the next cohort runs in the same workers; new data is sent anew
    # (through shared memory) and used
    pids = [p.pid for p in engine.processes]
    loss_fn = classification_loss(model)
    for xs in (x, x + 1.0):
        want = LoopEngine().run_cohort(algorithm, loss_fn, xs, y, inputs)
        got = engine.run_cohort(algorithm, loss_fn, xs, y, inputs)
        torch.testing.assert_close(got.mean_delta, want.mean_delta)
        torch.testing.assert_close(got.metrics.as_dict(), want.metrics.as_dict())
        assert xs.is_shared()
    assert [p.pid for p in engine.processes] == pids


def test_kept_deltas_feed_robust_aggregation(engine):
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    algorithm = build_algorithm("scaffold", local_lr=0.05)
    robust = RobustRound(build_aggregator("median"), Attack("sign_flip", 0.25, 10.0),
                         torch.tensor([3]))
    loss_fn = classification_loss(model)

    def one_round(eng):
        params = _params(model)
        store = ClientStore(CLIENTS, algorithm.client_init(params))
        setup = RoundSetup(algorithm, eng, loss_fn, store, x, y, robust=robust)
        return federated_round(setup, params, algorithm.server_init(params),
                               RoundDraw(torch.arange(CLIENTS), sample_idx, weights))

    want = one_round(LoopEngine(keep_deltas=True))
    engine.keep_deltas = True
    try:
        got = one_round(engine)
    finally:
        engine.keep_deltas = False
    assert got.cohort.deltas is not None and engine.fallback is None
    torch.testing.assert_close(got.cohort.deltas, want.cohort.deltas)
    torch.testing.assert_close(got.params, want.params)
    torch.testing.assert_close(got.cohort.metrics.as_dict(), want.cohort.metrics.as_dict())


class _Unpicklable:
    """A loss holding a lock: pickling it fails."""

    def __init__(self, model):
        self.loss, self.lock = classification_loss(model), threading.Lock()

    def __call__(self, *args):
        return self.loss(*args)


def test_unpicklable_loss_runs_in_process_with_one_warning(caplog):
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    with pytest.raises(TypeError):
        pickle_for_workers(_Unpicklable(model))
    eng = ProcessEngine(workers=2)
    fedavg = build_algorithm("fedavg", local_lr=0.05)
    inputs = _inputs(x, sample_idx, weights, _params(model))
    with caplog.at_level(logging.WARNING, "fedforge.engine.procs"):
        got_one = eng.run_cohort(fedavg, _Unpicklable(model), x, y, inputs)
        # from then on every cohort runs in this process, with the loop's results exactly
        algorithm = build_algorithm("scaffold", local_lr=0.05)
        got = _run(algorithm, eng, model, x, y, sample_idx, weights)
    want_one = LoopEngine().run_cohort(fedavg, _Unpicklable(model), x, y, inputs)
    torch.testing.assert_close(got_one.mean_delta, want_one.mean_delta, rtol=0, atol=0)
    assert_same_run(_run(algorithm, LoopEngine(), model, x, y, sample_idx, weights), got, 0, 0)
    assert eng.fallback is not None and "cannot be pickled" in eng.fallback
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # once, not per cohort
    assert eng.processes == [] and eng._pool is None
    rep = eng.report()
    assert rep["engine_procs_workers"] == 1 and "cannot be pickled" in rep["engine_procs_fallback"]
    assert eng.report() == {} and eng.state_dict()["workers"] == 1


def _closure_loss(model):
    loss = classification_loss(model)
    return lambda params, x, y, w: loss(params, x, y, w)


def test_one_worker_or_one_client_never_spawns(monkeypatch):
    def no_spawn(*args, **kwargs):
        raise AssertionError("spawned a worker")

    monkeypatch.setattr("fedforge.engine.procs.WorkerPool.__init__", no_spawn)
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    algorithm = build_algorithm("fedadam", local_lr=0.05)
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    one = ProcessEngine(workers=1)
    assert_same_run(ref, _run(algorithm, one, model, x, y, sample_idx, weights), 0, 0)
    assert one.report() == {"engine_procs_workers": 1, "engine_procs_inner": "loop"}
    two = ProcessEngine(workers=2)  # a one-client cohort has nothing to split
    inputs = _inputs(x, sample_idx, weights, _params(model), num=1)
    loss_fn = _closure_loss(model)  # a closure: sent by value when workers are used
    want = LoopEngine().run_cohort(algorithm, loss_fn, x, y, inputs)
    got = two.run_cohort(algorithm, loss_fn, x, y, inputs)
    torch.testing.assert_close(got.mean_delta, want.mean_delta, rtol=0, atol=0)
    assert two.fallback is None and two._tokens == {}


def test_options_state_and_registry():
    assert isinstance(build_engine(EngineConfig(name="procs", chunk_size=4),
                                   allow_processes=False), ProcessEngine)
    assert ProcessEngine().workers == default_workers() >= 1
    eng = ProcessEngine(workers=3, inner="vmap", chunk_size=2)
    assert eng.chunk_size(None, None) == 2 and eng.functional_grad  # the inner engine's
    assert eng.state_dict() == {"workers": 3, "inner": "vmap", "channels_last": False}
    eng.load_state_dict({"workers": 2, "inner": "loop"})
    assert (eng.workers, eng.inner_name, eng.functional_grad) == (2, "loop", False)
    eng.load_state_dict({"workers": 2, "inner": "loop", "channels_last": True})
    assert eng.channels_last and eng.inner.channels_last  # the workers' loop, rebuilt
    for bad in ({"workers": 0}, {"inner": "auto"}, {"inner": "vmap", "channels_last": True}):
        with pytest.raises(ValueError):
            ProcessEngine(**bad)
    with pytest.raises(ValueError, match="engine.workers"):
        eng.load_state_dict({"workers": "two"})


def test_a_closure_travels_by_value():
    import pickle

    scale = 3.0

    def outer():
        def f(t):
            return g(t) * scale  # reaches itself through g

        def g(t):
            return t + 1 if t < 0 else f(t - 10)

        return f

    f = pickle.loads(pickle_for_workers(outer()))
    assert f(torch.tensor(5.0)) == (torch.tensor(5.0) - 10 + 1) * 9
    with pytest.raises((pickle.PicklingError, AttributeError)):  # the standard pickle
        pickle.dumps(outer())


@pytest.mark.slow  # spawns the workers of three runs
def test_config_engine_procs_runs_records_its_workers_and_resumes_bit_exact(tmp_path):
    before = {p.pid for p in mp.active_children()}
    over = {"rounds": 2, "eval.every": 1, "checkpoint.every": 1}
    got = run_experiment(_cfg(**over, **{"engine.name": "procs"}), tmp_path / "p",
                         progress=False)
    assert {p.pid for p in mp.active_children()} <= before  # the run closed its workers
    assert got[0]["engine_procs_workers"] == default_workers()
    assert got[0]["engine_procs_inner"] == "loop" and "engine_procs_fallback" not in got[0]
    assert "engine_procs_workers" not in got[1]
    want = run_experiment(_cfg(**over, **{"engine.name": "loop"}), tmp_path / "l",
                          progress=False)
    for a, b in zip(got, want, strict=True):
        a, b = without_wall_clock(a), without_wall_clock(b)
        assert a.keys() == b.keys()
        for k in a:
            same = (math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6)
                    if isinstance(a[k], float) else a[k] == b[k])
            assert same, (k, a[k], b[k])
    # interrupted after round 1: the resumed run takes the recorded worker count
    run_experiment(_cfg(**{**over, "rounds": 1}, **{"engine.name": "procs"}), tmp_path / "r",
                   progress=False)
    resumed = run_experiment(_cfg(**over, **{"engine.name": "procs"}), tmp_path / "r",
                             resume=True, progress=False)
    assert [without_wall_clock(r) for r in resumed] == [without_wall_clock(r) for r in got]
    assert "engine_procs_workers" not in resumed[1]  # recorded once, by the first part
    ck = "checkpoints/round_00002.safetensors"
    a, b = load_file(str(tmp_path / "p" / ck)), load_file(str(tmp_path / "r" / ck))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # starts the workers again
def test_a_dead_worker_is_named_and_the_next_cohort_starts_new_ones(engine):
    model = _model()
    x, y, sample_idx, weights = _data(KIND, SHAPE)
    algorithm, loss_fn = build_algorithm("fedavg", local_lr=0.05), classification_loss(model)
    inputs = _inputs(x, sample_idx, weights, _params(model))
    engine.run_cohort(algorithm, loss_fn, x, y, inputs)
    victim = engine.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    with pytest.raises(RuntimeError, match=rf"^procs engine worker {victim.pid} exited "
                                           rf"\(code -9\) in 'run'"):
        engine.run_cohort(algorithm, loss_fn, x, y, inputs)
    assert engine.processes == [] and engine.fallback is None  # all ended, none left behind
    got = engine.run_cohort(algorithm, loss_fn, x, y, inputs)
    assert victim.pid not in [p.pid for p in engine.processes]
    want = LoopEngine().run_cohort(algorithm, loss_fn, x, y, inputs)
    torch.testing.assert_close(got.mean_delta, want.mean_delta)


def test_close_leaves_no_process(engine):
    if not engine.processes:  # run alone: start the workers first
        model = _model()
        x, y, sample_idx, weights = _data(KIND, SHAPE)
        engine.run_cohort(build_algorithm("fedavg", local_lr=0.05), classification_loss(model),
                          x, y, _inputs(x, sample_idx, weights, _params(model)))
    procs = engine.processes
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    engine.close()
    assert not any(p.is_alive() for p in procs) and all(p.exitcode is not None for p in procs)
    assert not {p.pid for p in procs} & {p.pid for p in mp.active_children()}
    assert engine.processes == [] and engine.describe() == []
