"""A run too short for auto's full calibration still measures: the loop on one client, then
the loop in worker processes when their trial fits PROCESS_TRIAL_SHARE of the run."""

import pytest

from fedforge.engine import AutoEngine
from fedforge.engine import auto as auto_mod
from tests.engine.test_auto import _setup
from tests.engine.test_parity import _run


def _calls(monkeypatch, workers: int, ms: float = 50.0) -> dict:
    monkeypatch.setattr(auto_mod, "process_workers", lambda x_all: workers)
    monkeypatch.setattr(auto_mod, "_ms_per_update", lambda *a: ms)
    seen: dict = {}

    def timed(self, algorithm, loss_fn, x_all, y_all, inputs, best, best_ms, n, t0,
              allowed=None):
        seen.update(best=best[0], best_ms=best_ms, workers=n, allowed=allowed)
        return best, best_ms

    monkeypatch.setattr(AutoEngine, "_time_processes", timed)
    return seen


@pytest.mark.parametrize("budget", [150, 40_000])
def test_short_run_times_the_loop_then_offers_processes_their_share(monkeypatch, budget):
    seen = _calls(monkeypatch, workers=2)
    model, (x, y, idx, w), algo = _setup()
    engine = AutoEngine(budget_updates=budget, allow_processes=True, max_share=0.0)
    _run(algo, engine, model, x, y, idx, w)
    # 10 % of the run projected at the loop's 50 ms per update
    assert seen["allowed"] == pytest.approx(0.1 * 0.05 * budget)
    assert seen["best"] == {"engine": "loop", "chunk": 1, "conv": "native"}
    assert seen["best_ms"] == 50.0 and seen["workers"] == 2
    assert engine.choice["calibrated"] is True and "too short" in engine.choice["reason"]
    assert engine.report()["engine_auto_ms"] == {"loop": 50.0}


def test_a_3_round_run_cannot_afford_the_processes():
    """3 rounds of 50 clients at 60 ms per update: 9 s of training; starting and timing
    worker processes (3 s and 8 client updates) exceeds 10 % of it."""
    need = auto_mod.PROCESS_START_S + 2 * auto_mod.loop_clients_per_worker(60.0) * 0.06
    assert need > auto_mod.PROCESS_TRIAL_SHARE * 0.06 * 3 * 50


@pytest.mark.parametrize("workers, allow", [(1, True), (2, False)])
def test_without_worker_processes_a_short_run_takes_the_default(monkeypatch, workers, allow):
    seen = _calls(monkeypatch, workers=workers)
    model, (x, y, idx, w), algo = _setup()
    engine = AutoEngine(budget_updates=150, allow_processes=allow, max_share=0.0)
    _run(algo, engine, model, x, y, idx, w)
    assert not seen and engine.choice["calibrated"] is False
    assert engine.choice["engine"] == "loop"
