"""``fedforge bench w3``: one config, three engines (fedforge, a plain PyTorch loop, Flower)
running the same experiment, one row each."""

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedforge.bench import flower_w1
from fedforge.bench.plain_fl import (
    baseline_lr,
    build_network,
    draw_cohort,
    fedavg_round,
    load_federated,
    run_plain,
)
from fedforge.cli import app
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, run_experiment

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """A 610-parameter model trained a few samples at a time: one intra-op thread is faster,
    and far faster on a busy machine (thread spinning); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_config(tmp_path: Path, rounds: int = 4, extra: str = "") -> Path:
    """The quickstart (in-memory LEAF Synthetic, logistic regression) with few rounds,
    evaluated every 2 rounds, on the LoopEngine."""
    text = QUICKSTART.read_text().replace("rounds = 40", f"rounds = {rounds}")
    text = text.replace("every = 5", "every = 2")
    path = tmp_path / "w3.toml"
    path.write_text(text + '\n[engine]\nname = "loop"\n' + extra)
    return path


def test_plain_rounds_equal_fedforge_rounds(tmp_path):
    """Same clients, batches and order: the plain loop's global model after rounds 1 and 2 is
    fedforge's to float tolerance, and a wrong lr or uniform weights would be caught."""
    cfg = load_config(QUICKSTART, ["rounds=2", "engine.name=loop", "engine.device=cpu"])
    run_experiment(cfg, tmp_path / "ff", progress=False)
    want = Experiment.load(tmp_path / "ff").params()
    data = load_federated(cfg)
    sizes = data.client_sizes()

    def plain(lr: float, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        net = build_network(cfg, data)
        for t in (1, 2):
            fedavg_round(net, data, draw_cohort(cfg, sizes, t), weights, lr)
        return net.state_dict()

    def gap(params: dict[str, torch.Tensor]) -> float:
        return max(float((params[k] - want[k]).abs().max()) for k in want)

    lr = baseline_lr(cfg)
    assert lr == 0.01
    assert gap(plain(lr, sizes)) < 1e-6
    assert gap(plain(2 * lr, sizes)) > 1e-4
    assert gap(plain(lr, torch.ones_like(sizes))) > 1e-4  # uniform instead of n_i / n


def test_cohorts_are_fedforge_draws():
    cfg = load_config(QUICKSTART, [])
    sizes = load_federated(cfg, torch.device("cpu")).client_sizes()
    cohort = draw_cohort(cfg, sizes, 3)
    again = draw_cohort(cfg, sizes, 3)
    assert len(cohort) == 10 and [c for c, _ in cohort] == [c for c, _ in again]
    assert all(torch.equal(torch.cat(a), torch.cat(b)) for (_, a), (_, b) in zip(cohort, again))
    for cid, batches in cohort:  # one epoch: every own sample once, batches of <= 10
        order = torch.cat(batches)
        assert sorted(order.tolist()) == list(range(int(sizes[cid])))
        assert all(0 < b.numel() <= 10 for b in batches)


def test_w3_cli_writes_one_row_per_engine(tmp_path):
    results = tmp_path / "results"
    res = CliRunner().invoke(app, [
        "bench", "w3", "--config", str(small_config(tmp_path)), "--engines", "fedforge,plain",
        "--target", "0.2", "--out", str(tmp_path / "run"), "--results", str(results)])
    assert res.exit_code == 0, res.output
    rows = [line for line in (results / "RESULTS.md").read_text().splitlines()
            if line.startswith("| ")]
    assert rows[0] == ("| engine | config | target | round reached | wall s to target | "
                       "final acc | total wall s | vs fedforge |")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    assert [c[0] for c in cells] == ["fedforge", "plain"]
    for c in cells:  # both reach 0.2 at the round-2 evaluation with the same accuracy, and stop
        assert c[1:4] == ["w3.toml", "0.20", "2"]
        assert 0 < float(c[4]) <= float(c[6]) and float(c[5]) >= 0.2
    assert cells[0][5] == cells[1][5] and cells[0][7] == "1.00x" and cells[1][7].endswith("x")
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_plain_runs_to_the_last_round_when_the_target_is_not_reached(tmp_path):
    cfg = load_config(small_config(tmp_path, rounds=3), [])
    res = run_plain(cfg, 0.99)
    assert res.round is None and res.wall_s is None and res.rounds_run == 3
    assert 0 < res.accuracy < 0.99 and res.total_s > 0


def one_line_error(args: list[str], tmp_path: Path) -> str:
    results = tmp_path / "results"
    res = CliRunner().invoke(app, ["bench", "w3", *args, "--out", str(tmp_path / "run"),
                                   "--results", str(results)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert not results.exists() and not (tmp_path / "run").exists()  # nothing ran
    return lines[0]


def test_unknown_engine_is_one_line(tmp_path):
    line = one_line_error(["--config", str(small_config(tmp_path)), "--engines",
                           "fedforge,jax"], tmp_path)
    assert "--engines" in line and "'jax'" in line and "fedforge, plain, flower" in line


def test_missing_flower_refuses_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(flower_w1, "flower_missing", lambda: "ray")
    line = one_line_error(["--config", str(small_config(tmp_path)), "--engines",
                           "fedforge,flower"], tmp_path)
    assert 'pip install "fedforge[bench]"' in line and "'ray'" in line


def test_baselines_refuse_what_they_do_not_implement(tmp_path):
    path = small_config(tmp_path)
    path.write_text(path.read_text().replace('name = "fedavg"', 'name = "scaffold"'))
    line = one_line_error(["--config", str(path), "--engines", "fedforge,plain"], tmp_path)
    assert "--engines" in line and "algorithm.name = 'scaffold'" in line
    with pytest.raises(ValueError, match="client_optimizer"):
        baseline_lr(load_config(QUICKSTART, ["algorithm.client_optimizer=momentum"]))


@pytest.mark.slow
def test_flower_reaches_the_same_accuracy_as_the_plain_loop(tmp_path):
    """Ray start-up makes this slow; the same clients, batches and weights give Flower's
    FedAvg the plain loop's accuracy."""
    pytest.importorskip("flwr.simulation")
    pytest.importorskip("ray")
    from fedforge.bench.flower_w3 import run_flower

    cfg = load_config(small_config(tmp_path), ["engine.device=cpu"])
    flower, plain = run_flower(cfg, 0.2), run_plain(cfg, 0.2)
    assert flower.round == plain.round == flower.rounds_run == 2
    assert flower.accuracy == pytest.approx(plain.accuracy, abs=1e-3)
    assert 0 < flower.wall_s < flower.total_s
