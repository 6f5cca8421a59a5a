"""AutoEngine: the calibrated choice trains like the reference, short runs run the measured
default bit for bit, and a resumed run reuses the recorded choice without recalibrating."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.engine import AutoEngine, LoopEngine, ProcessEngine, VmapEngine
from fedforge.engine import auto as auto_mod
from fedforge.engine.base import CohortInputs
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.models import build_model
from tests.engine.test_batched_conv import LENET_LIKE
from tests.engine.test_parity import MODELS, _data, _hparams, _run, assert_same_run

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def _setup():
    name, shape, kwargs = LENET_LIKE
    torch.manual_seed(0)
    model = build_model(name, shape, 5, **kwargs)
    return model, _data("image", shape), build_algorithm("scaffold", local_lr=0.05)


def test_calibrated_choice_agrees_with_loop_and_records_timings():
    model, (x, y, idx, w), algo = _setup()
    engine = AutoEngine(budget_updates=10**6)
    got = _run(algo, engine, model, x, y, idx, w)
    ref = _run(algo, LoopEngine(), model, x, y, idx, w)
    assert_same_run(ref, got, rtol=1e-4)
    assert engine.choice["calibrated"] is True
    labels = {"loop", "loop channels_last", "vmap chunk 4 conv native",
              "vmap chunk 4 conv auto", "vmap chunk 2 conv native", "vmap chunk 2 conv auto"}
    assert set(engine.timings) <= labels and "loop" in engine.timings
    assert min(engine.timings, key=engine.timings.get) == auto_mod._label(engine.choice)
    rep = engine.report()
    assert rep["engine_auto"] == auto_mod._label(engine.choice) and engine.report() == {}


@pytest.mark.slow  # every registered algorithm, each calibrating
@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_every_algorithm_trains_under_auto_as_under_the_loop(algo_name):
    """Whichever candidate the calibration keeps (on a 2-D conv net: loop, channels-last
    loop, vmap with native or batched convolutions), the run is the loop's."""
    model, (x, y, idx, w), _ = _setup()
    algo = build_algorithm(algo_name, **_hparams(algo_name))
    engine = AutoEngine(budget_updates=10**6)
    got = _run(algo, engine, model, x, y, idx, w)
    assert engine.choice["calibrated"] is True
    assert_same_run(_run(algo, LoopEngine(), model, x, y, idx, w), got, rtol=1e-4)


@pytest.mark.parametrize("model_name, default", [("lenet5", LoopEngine), ("mlp", VmapEngine)])
def test_short_run_is_the_measured_default_bit_for_bit(model_name, default):
    """Too short to calibrate: a CPU conv net runs the loop (vmapped convolutions lose to it
    there, benchmarks/RESULTS.md), anything else the vmapped engine, and metrics say which."""
    if model_name == "lenet5":
        model, (x, y, idx, w), algo = _setup()
    else:
        shape, kwargs, kind = MODELS["mlp"]
        torch.manual_seed(0)
        model = build_model("mlp", shape, 5, **kwargs)
        x, y, idx, w = _data(kind, shape)
        algo = build_algorithm("scaffold", local_lr=0.05)
    engine = AutoEngine(budget_updates=100)  # 2 % of 100 updates is less than one chunk
    got = _run(algo, engine, model, x, y, idx, w)
    ref = _run(algo, default(), model, x, y, idx, w)
    assert engine.choice["calibrated"] is False and "too short" in engine.choice["reason"]
    assert_same_run(ref, got, rtol=0, atol=0)
    rep = engine.report()
    label = "loop" if default is LoopEngine else "vmap chunk auto conv native"
    assert rep["engine_auto"] == label
    assert "too short" in rep["engine_auto_reason"] and engine.report() == {}


@pytest.mark.parametrize("threshold, default", [(1, LoopEngine), (2**40, VmapEngine)])
def test_a_short_run_with_a_heavy_step_runs_the_loop(monkeypatch, threshold, default):
    """Uncalibrated, a model without convolutions runs the loop once one client's step keeps
    LOOP_ACTIVATION_BYTES of activations (the MLP's few kB cross a 1-byte threshold, never a
    1 TiB one), bit for bit as the loop itself, and the report says which."""
    shape, kwargs, kind = MODELS["mlp"]
    torch.manual_seed(0)
    model = build_model("mlp", shape, 5, **kwargs)
    x, y, idx, w = _data(kind, shape)
    algo = build_algorithm("fedavg", local_lr=0.05)
    monkeypatch.setattr(auto_mod, "LOOP_ACTIVATION_BYTES", threshold)
    engine = AutoEngine(budget_updates=100)
    got = _run(algo, engine, model, x, y, idx, w)
    assert engine.choice["calibrated"] is False
    assert_same_run(_run(algo, default(), model, x, y, idx, w), got, rtol=0, atol=0)
    assert engine.report()["engine_auto"] == ("loop" if default is LoopEngine
                                              else "vmap chunk auto conv native")


def test_the_threshold_lies_between_the_steps_measured():
    """The MLP's step (where vmap won) is below the threshold; transformer_tiny's at W1 text
    shapes (where the loop won: 27 MiB) is above it."""
    from fedforge.engine import classification_loss
    from fedforge.engine.activations import saved_activation_bytes

    def step_bytes(name, shape, x):
        torch.manual_seed(0)
        model = build_model(name, shape, 80)
        params = {k: v.detach() for k, v in model.named_parameters()}
        return saved_activation_bytes(classification_loss(model, "fp32"), params, x,
                                      torch.zeros(32, dtype=torch.long), torch.ones(32))

    mlp = step_bytes("mlp", (1, 28, 28), torch.randn(32, 1, 28, 28))
    tiny = step_bytes("transformer_tiny", (80,), torch.randint(1, 80, (32, 80)))
    assert mlp < auto_mod.LOOP_ACTIVATION_BYTES < tiny


def test_recorded_choice_is_reused_without_calibrating(monkeypatch):
    model, (x, y, idx, w), algo = _setup()
    first = AutoEngine(budget_updates=10**6)
    _run(algo, first, model, x, y, idx, w)
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint meta stores it
    second = AutoEngine(budget_updates=10**6)
    monkeypatch.setattr(AutoEngine, "_choose", lambda *a: pytest.fail("recalibrated"))
    second.load_state_dict(state)
    assert _run(algo, second, model, x, y, idx, w)  # runs with the recorded engine
    assert second.choice == first.choice
    assert second.engine.state_dict() == first.engine.state_dict()  # same conv strategies
    with pytest.raises(ValueError, match="unknown recorded engine"):
        AutoEngine().load_state_dict({"choice": {"engine": "jax"}})


def test_cpu_conv_net_times_the_channels_last_loop_and_a_resume_rebuilds_it(monkeypatch):
    """On a CPU a 2-D conv net also times the loop in channels-last layout; a recorded
    channels-last choice comes back as that loop, not the plain one."""
    model, (x, y, idx, w), algo = _setup()
    engine = AutoEngine(budget_updates=10**6)
    _run(algo, engine, model, x, y, idx, w)
    assert "loop channels_last" in engine.timings
    # forced: a resumed run that had chosen the channels-last loop
    monkeypatch.setattr(AutoEngine, "_choose", lambda *a: pytest.fail("recalibrated"))
    state = {**engine.state_dict(),
             "choice": {"engine": "loop", "chunk": 1, "conv": "channels_last",
                        "calibrated": True}}
    resumed = AutoEngine(budget_updates=10**6)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert isinstance(resumed.engine, LoopEngine) and resumed.engine.channels_last
    assert auto_mod._label(resumed.choice) == "loop channels_last"
    ref = _run(algo, LoopEngine(), model, x, y, idx, w)
    assert_same_run(ref, _run(algo, resumed, model, x, y, idx, w), rtol=1e-4)
    with pytest.raises(ValueError, match="unknown recorded loop conv"):
        AutoEngine().load_state_dict({"choice": {"engine": "loop", "conv": "nhwc"}})


def test_channels_last_is_a_candidate_only_for_2d_conv_nets_on_cpu():
    shape, kwargs, kind = MODELS["mlp"]
    mlp = build_model("mlp", shape, 5, **kwargs)
    cnn = _setup()[0]
    x, _, idx, w = _data(kind, shape)
    engine = AutoEngine()
    for model, expected in ((mlp, False), (cnn, True)):
        params = dict(model.named_parameters())
        inputs = CohortInputs(params, {}, {}, {}, idx, w, torch.full((idx.shape[0],), 0.25))
        cands = engine.candidates(inputs, x)
        assert ({"engine": "loop", "chunk": 1, "conv": "channels_last"} in cands) is expected
        assert cands[0] == {"engine": "loop", "chunk": 1, "conv": "native"}


def test_worker_processes_are_tried_only_where_allowed(monkeypatch):
    """A spawned worker re-imports the main module: only fedforge's own entry points are
    known to guard theirs, so ``auto`` leaves scripts, notebooks and tests in one process
    unless the caller allows processes (the command does); whoever allows them, the threads
    this process was given bound how many."""
    x = torch.zeros(2, 3)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    monkeypatch.setattr("sys.argv", ["/venv/bin/fedforge", "run", "c.toml"])  # not consulted
    assert AutoEngine()._workers(x) == 0
    assert AutoEngine(allow_processes=True)._workers(x) == auto_mod.default_workers()
    assert AutoEngine(allow_processes=True)._workers(x.to("meta")) == 0  # off the CPU
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert auto_mod.process_workers(x) == 1  # OMP_NUM_THREADS=1: one worker, so none


@pytest.mark.slow  # spawns worker processes
def test_auto_times_worker_processes_and_a_resume_rebuilds_them(monkeypatch):
    model, (x, y, idx, w), algo = _setup()
    monkeypatch.setattr(auto_mod, "process_workers", lambda x_all: 2)
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.0)
    engine = AutoEngine(budget_updates=10**6, allow_processes=True)
    ref = _run(algo, LoopEngine(), model, x, y, idx, w)
    with engine:
        assert_same_run(ref, _run(algo, engine, model, x, y, idx, w), rtol=1e-4)
        assert any(k.startswith("procs 2 x ") for k in engine.timings), engine.timings
    assert not getattr(engine.engine, "processes", [])  # closed with the auto engine
    monkeypatch.setattr(AutoEngine, "_choose", lambda *a: pytest.fail("recalibrated"))
    choice = {"engine": "procs", "inner": "loop", "chunk": 1, "conv": "native", "workers": 2,
              "calibrated": True}
    with pytest.raises(ValueError, match=r"^checkpoint field 'engine.choice': this run chose "
                                         r"worker processes \(procs 2 x loop\); resume it "
                                         r"from the fedforge command or with allow_processes"):
        AutoEngine(budget_updates=10**6).load_state_dict({"choice": choice})
    resumed = AutoEngine(budget_updates=10**6, allow_processes=True)
    resumed.load_state_dict(json.loads(json.dumps({"choice": choice, "workers": 2,
                                                   "inner": "loop"})))
    assert auto_mod._label(resumed.choice) == "procs 2 x loop"
    with resumed:
        assert_same_run(ref, _run(algo, resumed, model, x, y, idx, w), rtol=1e-4)
        assert len(resumed.engine.processes) == 2
    with pytest.raises(ValueError, match="unknown recorded procs inner"):
        AutoEngine(allow_processes=True).load_state_dict(
            {"choice": {"engine": "procs", "inner": "jax"}})
    with pytest.raises(ValueError, match="unknown recorded procs conv"):
        AutoEngine(allow_processes=True).load_state_dict(
            {"choice": {"engine": "procs", "inner": "vmap", "conv": "channels_last"}})


@pytest.mark.parametrize(("loop_ms", "loop_cl_ms", "conv"),
                         [(5.0, 4.0, "channels_last"), (4.0, 5.0, "native")])
def test_worker_processes_take_the_loop_layout_that_won_here(monkeypatch, loop_ms, loop_cl_ms,
                                                             conv):
    """The workers run the loop in channels-last layout exactly when that loop beat the
    plain one in this process (timings forced; the processes' own timing is faked)."""
    model, (x, y, idx, w), algo = _setup()
    built = []
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.0)
    monkeypatch.setattr(AutoEngine, "build", lambda self, cand: built.append(cand) or
                        ProcessEngine(workers=1))  # never spawns
    monkeypatch.setattr(auto_mod, "_ms_per_update", lambda *a: 1.0)
    engine = AutoEngine(budget_updates=10**6)
    engine.timings = {"loop": loop_ms, "loop channels_last": loop_cl_ms}
    params = dict(model.named_parameters())
    inputs = CohortInputs(params, {}, {}, {}, idx, w, torch.full((idx.shape[0],), 0.25))
    best = ({"engine": "loop", "chunk": 1, "conv": "native"}, LoopEngine())
    engine._time_processes(algo, None, x, y, inputs, best, 9.0, 2, time.perf_counter())
    assert [c["conv"] for c in built if c["engine"] == "procs"] == [conv]


def _fake_clock(monkeypatch) -> list[float]:
    """The auto engine's clock, moved only by the test ([seconds]): what a test times then
    does not depend on how loaded the machine is."""
    now = [0.0]
    monkeypatch.setattr(auto_mod, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def _process_calls(monkeypatch, timings: dict, best: dict, best_ms: float, *,
                   budget_updates: int = 10**9, started_s_ago: float = 0.0,
                   reserved: bool = False) -> tuple[list[tuple[int, tuple]], AutoEngine]:
    """Run ``_time_processes`` on a cohort of 400 clients with ``timings`` already taken,
    ``started_s_ago`` seconds into the calibration, and timing stubbed -> (each timed call of
    the workers as (clients, the timing arguments after them), the engine)."""
    model, (x, y, idx, w), algo = _setup()
    idx, w = idx.repeat(100, 1, 1), w.repeat(100, 1, 1)
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.0)
    monkeypatch.setattr(AutoEngine, "build", lambda self, cand: ProcessEngine(workers=1))
    calls = []
    monkeypatch.setattr(auto_mod, "_ms_per_update",
                        lambda eng, a, l, x, y, inputs, *extra: calls.append(
                            (inputs.sample_idx.shape[0], extra)) or 1.0)
    engine = AutoEngine(budget_updates=budget_updates)
    engine.timings = dict(timings)
    inputs = CohortInputs(dict(model.named_parameters()), {}, {}, {}, idx, w,
                          torch.full((idx.shape[0],), 0.25))
    engine._time_processes(algo, None, x, y, inputs, (best, LoopEngine()), best_ms, 2,
                           time.perf_counter() - started_s_ago, reserved=reserved)
    return calls, engine


LOOP = {"engine": "loop", "chunk": 1, "conv": "native"}


@pytest.mark.parametrize(("loop_ms", "per_worker"), [(500.0, 4), (5.0, 20), (0.5, 200)])
def test_a_fast_models_workers_are_timed_on_enough_clients(monkeypatch, loop_ms, per_worker):
    """Each worker trains at least 0.1 s per timed call (4 clients at least), so the per-call
    cost does not decide a fast model's timing; capped by the cohort."""
    calls, _ = _process_calls(monkeypatch, {"loop": loop_ms}, LOOP, loop_ms)
    assert [clients for clients, _ in calls] == [min(2 * per_worker, 400)]


def test_workers_are_sized_by_the_loops_time_not_the_in_process_winners(monkeypatch):
    """A vmap winner at 10 ms would ask 10 clients of each worker (0.2 s reserved); the workers
    run the loop, whose faster layout takes 250 ms, so they are timed on 4 each and the
    calibration keeps 3 s for that."""
    calls, engine = _process_calls(
        monkeypatch, {"loop": 500.0, "loop channels_last": 250.0,
                      "vmap chunk 8 conv native": 10.0},
        {"engine": "vmap", "chunk": 8, "conv": "native"}, 10.0)
    assert calls[0][0] == 2 * 4
    assert engine._fastest_loop(10.0) == ("channels_last", 250.0)
    # a warm-up and PROCESS_TIMED_CALLS (2) timed calls of 4 clients at 250 ms
    assert engine._process_reserve_s(2, 250.0) == pytest.approx(3 * 4 * 0.25)


@pytest.mark.slow  # spawns worker processes
def test_short_cpu_conv_run_times_worker_processes_where_they_can_pay_off(monkeypatch):
    """A run too short for the full calibration times the loop on one client; with worker
    processes allowed and a run long enough to pay their start-up it times them too and
    keeps the faster, which trains with the loop's maths."""
    model, (x, y, idx, w), algo = _setup()
    monkeypatch.setattr(auto_mod, "process_workers", lambda x_all: 2)
    small = AutoEngine(budget_updates=16, max_share=0.0, allow_processes=True)
    assert _run(algo, small, model, x, y, idx, w) and small.choice["engine"] == "loop"
    assert small.choice["calibrated"] is True and "too short" in small.choice["reason"]
    unallowed = AutoEngine(budget_updates=10**6, max_share=0.0)
    assert _run(algo, unallowed, model, x, y, idx, w) and unallowed.choice["engine"] == "loop"
    assert unallowed.choice["calibrated"] is False
    monkeypatch.setattr(auto_mod, "_ms_per_update",  # the processes time faster here
                        lambda eng, *a: 1.0 if isinstance(eng, ProcessEngine) else 100.0)
    with AutoEngine(budget_updates=10**6, max_share=0.0, allow_processes=True) as engine:
        got = _run(algo, engine, model, x, y, idx, w)
        assert auto_mod._label(engine.choice) == "procs 2 x loop"
        assert len(engine.engine.processes) == 2
    assert_same_run(_run(algo, LoopEngine(), model, x, y, idx, w), got, rtol=1e-4)


def test_config_default_is_auto():
    assert load_config(QUICKSTART).engine.name == "auto"


def test_run_records_the_choice_and_resume_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setattr(auto_mod, "MAX_SHARE", 100.0)  # calibrate even this short run
    over = ["rounds=2", "eval.every=1", "checkpoint.every=2", "model.name=mlp",
            "model.options.hidden=[8]"]
    hist = run_experiment(load_config(QUICKSTART, over), tmp_path, progress=False)
    assert "engine_auto" in hist[0] and "engine_auto" not in hist[1]
    ckpt = tmp_path / "checkpoints"
    meta = json.loads((ckpt / json.loads((ckpt / "latest.json").read_text())["checkpoint"])
                      .read_text())
    assert auto_mod._label(meta["engine"]["choice"]) == hist[0]["engine_auto"]
    monkeypatch.setattr(AutoEngine, "_choose", lambda *a: pytest.fail("recalibrated"))
    over[0] = "rounds=3"
    more = run_experiment(load_config(QUICKSTART, over), tmp_path, resume=True,
                          progress=False)
    assert [r["round"] for r in more] == [1, 2, 3] and "engine_auto" not in more[2]



def test_calibration_leaves_the_worker_processes_their_share(monkeypatch):
    """In-process candidates stop before one would overrun the share minus what timing the
    worker processes needs, so a tight budget still tries them (each candidate: 0.2 s)."""
    model, (x, y, idx, w), algo = _setup()
    monkeypatch.setattr(auto_mod, "process_workers", lambda x_all: 2)
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.5)
    now = _fake_clock(monkeypatch)
    monkeypatch.setattr(auto_mod, "_ms_per_update",
                        lambda *a: now.__setitem__(0, now[0] + 0.2) or 10.0)
    seen = {}

    def record(self, algorithm, loss_fn, x_all, y_all, inputs, best, best_ms, workers, t0,
               **_):
        seen["left_s"] = self._share_s(best_ms) - (now[0] - t0)
        return best, best_ms

    monkeypatch.setattr(AutoEngine, "_time_processes", record)
    # share: 2 % x 10 ms x 5000 = 1 s
    engine = AutoEngine(budget_updates=5000, allow_processes=True)
    _run(algo, engine, model, x, y, idx, w)
    assert seen["left_s"] >= auto_mod.PROCESS_START_S


def test_worker_processes_are_timed_by_their_fastest_call(monkeypatch):
    """One slow moment must not decide a pick: worker processes are timed by the best of
    ``PROCESS_TIMED_CALLS`` calls after the warm-up, in-process candidates by one."""
    now = _fake_clock(monkeypatch)

    class Slow:
        def __init__(self):
            self.takes = [0.0, 0.12, 0.02]  # warm-up, a call during a load spike, a quiet one

        def run_cohort(self, *args):
            now[0] += self.takes.pop(0)

    sub = type("Sub", (), {"sample_idx": torch.zeros(4, 1, 1)})()
    assert auto_mod.PROCESS_TIMED_CALLS == 2
    fastest = auto_mod._ms_per_update(Slow(), None, None, None, None, sub,
                                      auto_mod.PROCESS_TIMED_CALLS)
    assert fastest == pytest.approx(20.0 / 4)  # the quiet call: 5 ms per update, not 30
    assert auto_mod._ms_per_update(Slow(), None, None, None, None, sub) == pytest.approx(
        120.0 / 4)
    calls, _ = _process_calls(monkeypatch, {}, LOOP, 10.0)
    assert [extra for _, extra in calls] == [(auto_mod.PROCESS_TIMED_CALLS,)]


@pytest.mark.parametrize("reserved", [True, False])
def test_the_loop_in_processes_is_timed_when_its_share_was_reserved(monkeypatch, reserved):
    """Past the share (an in-process candidate overran it), the loop in worker processes is
    still timed when the in-process candidates reserved its share (a CPU conv net), and
    not otherwise."""
    # a share of 2 % x 100 updates x 10 ms = 0.02 s, a minute past it
    calls, _ = _process_calls(monkeypatch, {}, LOOP, 10.0, budget_updates=100,
                              started_s_ago=60.0, reserved=reserved)
    assert len(calls) == (1 if reserved else 0)


@pytest.mark.parametrize("ratio", [2.5, 0.3])  # a load came after calibration, or went
def test_a_pick_whose_cohorts_drift_from_calibration_is_calibrated_again_once(ratio):
    engine = AutoEngine(budget_updates=10**6)
    engine.choice, engine.timings = {"engine": "loop", "conv": "native"}, {"loop": 10.0}
    engine.engine = LoopEngine()
    for _ in range(auto_mod.DRIFT_COHORTS - 1):
        engine.watch(ratio * 10.0 * 400 / 1000, 400)  # 400 clients at ratio x 10 ms
    assert engine.engine is not None  # not yet: DRIFT_COHORTS in a row
    engine.watch(1.0 * 10.0 * 400 / 1000, 400)  # one back on time breaks the run
    for _ in range(auto_mod.DRIFT_COHORTS - 1):
        engine.watch(ratio * 10.0 * 400 / 1000, 400)
    assert engine.engine is not None
    engine.watch(ratio * 10.0 * 400 / 1000, 400)  # now DRIFT_COHORTS in a row
    assert engine.engine is None and engine.choice is None and engine.rechecks == 1
    assert engine.state_dict() == {"rechecks": 1}  # a checkpoint here keeps the count
    engine.choice, engine.timings = {"engine": "loop", "conv": "native"}, {"loop": 10.0}
    engine.engine = LoopEngine()
    for _ in range(2 * auto_mod.DRIFT_COHORTS):  # MAX_RECHECKS reached: no third calibration
        engine.watch(ratio * 10.0 * 400 / 1000, 400)
    assert engine.engine is not None and engine.rechecks == auto_mod.MAX_RECHECKS


def test_cohorts_within_the_drift_factor_keep_the_pick():
    engine = AutoEngine(budget_updates=10**6)
    engine.choice, engine.timings = {"engine": "loop", "conv": "native"}, {"loop": 10.0}
    engine.engine = LoopEngine()
    for r in [1.9, 0.55, 1.0] * 3:  # inside the factor both ways
        engine.watch(r * 10.0 * 400 / 1000, 400)
    for _ in range(auto_mod.DRIFT_COHORTS):  # far off, but cohorts too short to tell
        engine.watch(5.0 * 10.0 * 4 / 1000, 4)
    assert engine.engine is not None and engine.rechecks == 0


def test_a_pick_a_checkpoint_holds_never_changes():
    """Once ``state_dict`` (a checkpoint) or ``load_state_dict`` (a resume) has seen the
    pick, drift no longer drops it, so a resume runs what the uninterrupted run ran."""
    for resumed in (False, True):
        engine = AutoEngine(budget_updates=10**6)
        state = {"choice": {"engine": "loop", "conv": "native", "calibrated": True},
                 "timings": {"loop": 10.0}}
        if resumed:
            engine.load_state_dict(state)
        else:
            engine.choice, engine.timings = dict(state["choice"]), {"loop": 10.0}
            engine.engine = LoopEngine()
            engine.state_dict()
        for _ in range(2 * auto_mod.DRIFT_COHORTS):
            engine.watch(3.0 * 10.0 * 400 / 1000, 400)
        assert engine.engine is not None and engine.rechecks == 0


def test_a_recalibrated_run_trains_as_the_loop_and_records_the_count(monkeypatch):
    """The calibration's timings claim the pick is 100x faster than it runs: after
    DRIFT_COHORTS cohorts the engine calibrates again, and the run is still the loop's; a
    resume from its checkpoint keeps the count."""
    model, (x, y, idx, w), algo = _setup()
    engine = AutoEngine(budget_updates=10**6)
    calls = []
    choose = AutoEngine._choose

    def counted(self, *a):
        calls.append(1)
        choose(self, *a)
        self.timings[auto_mod._label(self.choice)] /= 100.0

    monkeypatch.setattr(AutoEngine, "_choose", counted)
    monkeypatch.setattr(auto_mod, "DRIFT_MIN_S", 0.0)  # these cohorts take milliseconds
    rounds = auto_mod.DRIFT_COHORTS + 2
    got = _run(algo, engine, model, x, y, idx, w, rounds=rounds)
    assert len(calls) == 2 and engine.rechecks == 1
    assert_same_run(_run(algo, LoopEngine(), model, x, y, idx, w, rounds=rounds), got, rtol=1e-4)
    assert engine.report()["engine_auto_rechecks"] == 1
    resumed = AutoEngine(budget_updates=10**6)
    resumed.load_state_dict(json.loads(json.dumps(engine.state_dict())))
    assert resumed.rechecks == 1 and resumed.choice == engine.choice


@pytest.mark.parametrize(("vmap_ms", "kept"), [(63.9, "loop"), (61.0, "vmap"), (80.0, "loop")])
def test_a_vmapped_chunk_in_processes_must_beat_their_loop_by_the_margin(monkeypatch, vmap_ms,
                                                                         kept):
    """The loop in worker processes timed 72.2 ms per update; a vmapped chunk in them replaces
    it only when at least PROCESS_VMAP_MARGIN (15 %) faster: 63.9 ms is not (it lost the run),
    61.0 ms is."""
    model, (x, y, idx, w), algo = _setup()
    idx, w = idx.repeat(100, 1, 1), w.repeat(100, 1, 1)
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.0)
    monkeypatch.setattr(AutoEngine, "build", lambda self, cand: ProcessEngine(workers=1))
    times = iter([72.2, vmap_ms])
    monkeypatch.setattr(auto_mod, "_ms_per_update", lambda *a: next(times))
    engine = AutoEngine(budget_updates=10**9)
    engine.timings = {"loop": 100.0, "vmap chunk 5 conv native": 90.0}
    inputs = CohortInputs(dict(model.named_parameters()), {}, {}, {}, idx, w,
                          torch.full((idx.shape[0],), 0.25))
    vmap = {"engine": "vmap", "chunk": 5, "conv": "native"}
    best, ms = engine._time_processes(algo, None, x, y, inputs, (vmap, VmapEngine(5)), 90.0,
                                      2, time.perf_counter())
    assert (best[0]["engine"], best[0]["inner"]) == ("procs", kept)
    assert ms == (72.2 if kept == "loop" else vmap_ms)


@pytest.mark.parametrize(("procs_ms", "kept"), [(297.0, "procs"), (250.0, "procs"),
                                                (310.0, "loop")])
def test_worker_processes_within_the_preference_replace_the_in_process_loop(monkeypatch,
                                                                            procs_ms, kept):
    """The in-process loop timed 264 ms per update; the loop in worker processes replaces it
    up to PROCESS_PREFERENCE (15 %) slower: 297 ms does (W1's CNN, where the in-process loop
    then ran at 0.61x two plain processes), 310 ms does not."""
    model, (x, y, idx, w), algo = _setup()
    idx, w = idx.repeat(100, 1, 1), w.repeat(100, 1, 1)
    monkeypatch.setattr(auto_mod, "PROCESS_START_S", 0.0)
    monkeypatch.setattr(AutoEngine, "build", lambda self, cand: ProcessEngine(workers=1))
    monkeypatch.setattr(auto_mod, "_ms_per_update", lambda *a: procs_ms)
    engine = AutoEngine(budget_updates=10**9)
    engine.timings = {"loop": 264.0}
    inputs = CohortInputs(dict(model.named_parameters()), {}, {}, {}, idx, w,
                          torch.full((idx.shape[0],), 0.25))
    loop = {"engine": "loop", "chunk": 1, "conv": "native"}
    best, ms = engine._time_processes(algo, None, x, y, inputs, (loop, LoopEngine()), 264.0,
                                      2, time.perf_counter())
    assert best[0]["engine"] == kept
    assert ms == (procs_ms if kept == "procs" else 264.0)
