"""Seeds as a batch: S runs trained together equal S separate runs bit for bit."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten

import fedforge.experiment.build as build
from fedforge.core.checkpoint import load_checkpoint
from fedforge.engine.seed_batch import CohortBatch
from fedforge.experiment.config import apply_overrides, validate
from fedforge.experiment.runner import run_experiment
from fedforge.experiment.seed_batch import batch_refusal, run_seeds
from fedforge.reproduce.grid import run_grid
from tests.reproduce.test_reproduce import ROOT, tiny_spec

SEEDS = (0, 1, 2)
BASE = {
    "rounds": 4,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 12, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg", "local_lr": 0.05},
    "client": {"batch_size": 8, "local_steps": 3},
    "server": {"clients_per_round": 4},
    "eval": {"every": 2},
    "checkpoint": {"every": 2},
    # chunks of 3 and 1 client: equal chunks of the seeds stacked, and one ragged chunk each
    # one intra-op thread: with more, a stacked chunk's sums split otherwise (refused below)
    "engine": {"name": "vmap", "chunk_size": 3, "threads": 1},
}


def _cfgs(*over, base=BASE):
    return [validate(apply_overrides(base, [f"seed={s}", *over])) for s in SEEDS]


# one local epoch: each cohort's number of steps is its largest client's, so the seeds'
# chunks differ in steps and are padded to the longest with all-zero steps
EPOCHS = {**BASE, "client": {"batch_size": 8, "local_epochs": 1}}


def _model(run: Path) -> list[torch.Tensor]:
    tensors, _ = load_checkpoint(run / "checkpoints", torch.device("cpu"))
    return tree_flatten(tensors)[0]


def _same_runs(a: Path, b: Path) -> bool:
    """Every record (wall clock aside) and every checkpointed tensor identical."""
    from fedforge.experiment.runner import read_metrics
    from fedforge.study.labels import without_wall_clock

    ra, rb = ([without_wall_clock(r) for r in read_metrics(d)] for d in (a, b))
    ma, mb = _model(a), _model(b)
    return ra == rb and len(ma) == len(mb) and all(map(torch.equal, ma, mb))


SLOW = pytest.mark.slow


@pytest.mark.parametrize(("over", "base"), [
    ((), BASE),  # FedAvg
    (("algorithm.name=scaffold",), BASE),  # per-client control variates in the store
    (("algorithm.name=ditto",), BASE),  # a personalised method: personal models, own eval
    ((), EPOCHS),
    pytest.param(("algorithm.name=scaffold",), EPOCHS, marks=SLOW),
    pytest.param(("algorithm.name=ditto",), EPOCHS, marks=SLOW),
], ids=["fedavg", "scaffold", "ditto", "fedavg-epochs", "scaffold-epochs", "ditto-epochs"])
def test_a_batch_of_seeds_equals_separate_runs_bit_for_bit(tmp_path, over, base):
    cfgs = _cfgs(*over, base=base)
    for cfg in cfgs:
        run_experiment(cfg, tmp_path / f"alone{cfg.seed}", progress=False)
    run_seeds(cfgs, [tmp_path / f"batch{s}" for s in SEEDS])
    for s in SEEDS:
        assert _same_runs(tmp_path / f"alone{s}", tmp_path / f"batch{s}")


def test_a_stack_that_rounds_otherwise_keeps_the_separate_results(tmp_path, monkeypatch):
    """Where a CPU's kernels round a stacked chunk otherwise (the stacked results are nudged
    here), the check on each shape's first stacked call keeps the chunks trained alone."""
    import fedforge.engine.seed_batch as seed_batch

    own = seed_batch.tree_index
    nudged = lambda tree, i: torch.utils._pytree.tree_map(  # noqa: E731
        lambda t: t.nextafter(t.new_full((), 1e9)) if t.is_floating_point() else t, own(tree, i))
    monkeypatch.setattr(seed_batch, "tree_index", nudged)
    made = []
    monkeypatch.setattr(CohortBatch, "__init__", _recording(CohortBatch.__init__, made))
    cfgs = _cfgs("rounds=2")
    for cfg in cfgs:
        run_experiment(cfg, tmp_path / f"alone{cfg.seed}", progress=False)
    with pytest.warns(UserWarning, match="chunks of its shape train one at a time"):
        run_seeds(cfgs, [tmp_path / f"batch{s}" for s in SEEDS])
    for s in SEEDS:
        assert _same_runs(tmp_path / f"alone{s}", tmp_path / f"batch{s}")
    # round 1: the two shapes stacked and checked; round 2: 3 seeds x 2 chunks alone
    assert made[0].calls == 2 + 3 * 2


def test_seeds_sharing_one_rng_stream_differ(tmp_path, monkeypatch):
    """The comparison sees a batch whose seeds draw one stream (seed 0's cohorts)."""
    cfgs = _cfgs()
    for cfg in cfgs:
        run_experiment(cfg, tmp_path / f"alone{cfg.seed}", progress=False)
    own = build.round_generator
    monkeypatch.setattr(build, "round_generator", lambda seed, round_: own(0, round_))
    run_seeds(cfgs, [tmp_path / f"batch{s}" for s in SEEDS])
    assert _same_runs(tmp_path / "alone0", tmp_path / "batch0")
    assert not _same_runs(tmp_path / "alone1", tmp_path / "batch1")


@pytest.mark.parametrize("base", [BASE, EPOCHS], ids=["steps", "epochs"])
def test_chunks_of_the_seeds_train_in_one_vmapped_call(tmp_path, monkeypatch, base):
    """Per round one call for the seeds' chunks of 3 and one for their chunks of 1, not
    two per seed (with epochs too: their chunks differ in steps)."""
    made = []
    monkeypatch.setattr(CohortBatch, "__init__", _recording(CohortBatch.__init__, made))
    run_seeds(_cfgs("rounds=2", base=base), [tmp_path / f"batch{s}" for s in SEEDS])
    assert made[0].calls == 2 * 2


def _recording(init, made):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    return wrapped


def test_a_killed_batch_resumes_each_run(tmp_path):
    cfgs = _cfgs()
    dirs = [tmp_path / f"batch{s}" for s in SEEDS]
    run_seeds(_cfgs("rounds=2"), dirs)  # stopped after round 2's checkpoint
    run_seeds(cfgs, dirs, resume=True)
    for cfg, d in zip(cfgs, dirs, strict=True):
        run_experiment(cfg, tmp_path / f"alone{cfg.seed}", progress=False)
        assert _same_runs(tmp_path / f"alone{cfg.seed}", d)


def test_what_cannot_be_batched_runs_one_by_one_saying_why(tmp_path):
    assert batch_refusal(_cfgs("engine.name=loop")) == (
        "engine.name = 'loop' does not vmap its cohorts (use 'vmap')")
    assert batch_refusal(_cfgs()[:1]) == "one run is not a batch"
    mixed = [*_cfgs()[:2], validate(apply_overrides(BASE, ["seed=2", "rounds=3"]))]
    assert batch_refusal(mixed) == "the configs differ in more than their seed"
    assert batch_refusal(_cfgs("engine.compile=true")) is not None
    assert batch_refusal(_cfgs("engine.threads=2")) == (
        "2 intra-op threads split a stacked chunk's sums otherwise than a run's own chunk "
        "(engine.threads = 1 or OMP_NUM_THREADS=1 batches them)")
    assert batch_refusal(_cfgs("model.name=transformer_lm")) == (
        "model 'transformer_lm': batched seeds are checked bit for bit on logreg, mlp only")
    with pytest.warns(UserWarning, match="seeds run one by one: engine.name = 'loop'"):
        records = run_seeds(_cfgs("engine.name=loop", "rounds=2"),
                            [tmp_path / f"loop{s}" for s in SEEDS])
    assert [r["round"] for r in records[2]] == [1, 2]


@pytest.mark.slow
def test_reproduce_batch_seeds_writes_the_same_metrics(tmp_path):
    spec = tiny_spec()
    spec = replace(spec, overrides=(*spec.overrides, "engine.name=vmap", "engine.threads=1"))
    lines = []
    for name, batched in (("alone", False), ("batch", True)):
        run_grid(spec, root=ROOT, runs=tmp_path / name / "runs", data=tmp_path / name / "data",
                 progress=False, log=lines.append, batch_seeds=batched)
    assert "[reproduce tiny] slow seeds 0,1 as one batch" in lines
    for cond in ("slow", "fast"):
        for s in spec.seeds:
            a, b = (tmp_path / n / "runs" / "tiny" / cond / f"seed{s}" for n in ("alone", "batch"))
            assert _same_runs(a, b)
            committed = (tmp_path / n / "data" / "tiny" / cond / f"seed{s}.jsonl"
                         for n in ("alone", "batch"))
            assert len({p.read_bytes().count(b"\n") for p in committed}) == 1
