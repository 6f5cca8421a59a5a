"""fedforge bench pfl-ditto: the plain loop is Ditto (its round equals fedforge's on a tiny
float64 problem, and the checks tell Ditto from its near misses), and a --quick run through
the command fills every column and appends the table with its machine and load."""

import copy
import json
import statistics

import pytest
import torch
from typer.testing import CliRunner

from fedforge.algorithms import build_algorithm
from fedforge.bench.pfl_speed import HEADER, parse_cohorts, sample_clients
from fedforge.bench.pfl_speed_run import ProxSGD, plain_ditto_sum
from fedforge.cli import app
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import build_model

LR, LAM, CLIENTS, STEPS, BATCH = 0.1, 0.7, 3, 2, 4


def test_prox_sgd_step_by_hand():
    v = torch.tensor([1.0, -2.0], requires_grad=True)
    anchor = torch.tensor([0.5, 0.5])
    opt = ProxSGD([v], [anchor], lr=0.1, lam=2.0)
    v.grad = torch.tensor([0.3, -0.4])
    opt.step()
    # v - lr (g + lam (v - a)) = [1 - 0.1 (0.3 + 1.0), -2 - 0.1 (-0.4 - 5.0)]
    torch.testing.assert_close(v.detach(), torch.tensor([0.87, -1.46]))


def _problem():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(CLIENTS * STEPS * BATCH, 1, 4, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (x.shape[0],), generator=g)
    idx = torch.randperm(x.shape[0], generator=g).view(CLIENTS, STEPS, BATCH)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3).double()
    return model, x, y, idx


def _fedforge_round(name, engine, model, x, y, idx, **hp):
    algo = build_algorithm(name, local_lr=LR, **hp)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    store = ClientStore(CLIENTS, algo.client_init(params))
    setup = RoundSetup(algo, engine, classification_loss(model, "fp32"), store, x, y)
    res = federated_round(setup, params, algo.server_init(params),
                          RoundDraw(torch.arange(CLIENTS), idx,
                                    torch.ones(idx.shape, dtype=torch.float64)))
    personal = store.gather(torch.arange(CLIENTS)).get("personal", {})
    return res.params, personal


def _plain_round(model, x, y, idx, lam):
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    personal = {c: copy.deepcopy(model) for c in range(CLIENTS)}
    sums = plain_ditto_sum(copy.deepcopy(model), personal, start, x, y, idx, LR, lam)
    stacked = {k: torch.stack([personal[c].state_dict()[k] for c in range(CLIENTS)])
               for k in start}
    return {k: v / CLIENTS for k, v in sums.items()}, stacked


@pytest.mark.parametrize("engine", [LoopEngine, VmapEngine])
def test_the_plain_loops_ditto_round_is_fedforges(engine):
    model, x, y, idx = _problem()
    want_global, want_personal = _fedforge_round("ditto", engine(), model, x, y, idx, lam=LAM)
    got_global, got_personal = _plain_round(model, x, y, idx, LAM)
    assert set(got_global) == set(want_global) == set(want_personal)
    for k in want_global:
        torch.testing.assert_close(got_global[k], want_global[k], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got_personal[k], want_personal[k], rtol=1e-10, atol=1e-12)


def test_the_check_tells_ditto_from_its_near_misses():
    """The comparison above fails for a loop without the prox term, for prox toward the
    trained global copy, and for a global copy that is not FedAvg's."""
    model, x, y, idx = _problem()
    ff_global, ff_personal = _fedforge_round("ditto", LoopEngine(), model, x, y, idx, lam=LAM)
    fedavg, _ = _fedforge_round("fedavg", LoopEngine(), model, x, y, idx)
    for k in ff_global:  # Ditto's global model is FedAvg's
        torch.testing.assert_close(ff_global[k], fedavg[k], rtol=1e-10, atol=1e-12)
    _, no_prox = _plain_round(model, x, y, idx, 0.0)
    gap = max(float((no_prox[k] - ff_personal[k]).abs().max()) for k in ff_personal)
    assert gap > 1e-4
    # prox toward the global copy after its own steps (the wrong w^t)
    gap = max(float((_anchored_after_training(model, x, y, idx)[k] - ff_personal[k])
                    .abs().max()) for k in ff_personal)
    assert gap > 1e-4


def _anchored_after_training(model, x, y, idx):
    """Personal models pulled toward each client's trained global copy (ptrain after train)."""
    out = []
    for c in range(CLIENTS):
        w, v = copy.deepcopy(model), copy.deepcopy(model)
        for net, opt in ((w, torch.optim.SGD(w.parameters(), lr=LR)),
                         (v, ProxSGD(v.parameters(), [p.detach() for p in w.parameters()],
                                     LR, LAM))):
            for b in idx[c]:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[b]), y[b]).backward()
                opt.step()
        out.append(v.state_dict())
    return {k: torch.stack([s[k] for s in out]) for k in out[0]}

def test_cohorts_and_sampled_clients():
    assert parse_cohorts("10,100,1000") == [10, 100, 1000]
    for bad in ("", "0", "10,x", "-3"):
        with pytest.raises(ValueError, match="--cohorts"):
            parse_cohorts(bad)
    assert sample_clients(1000) == [0, 500, 999] and sample_clients(1) == [0]


@pytest.mark.parametrize("args, field", [(["--cohorts", "10,0"], "--cohorts"),
                                         (["--model", "nosuch"], "--model"),
                                         (["--iterations", "0"], "--iterations")])
def test_bad_options_are_one_line_errors(tmp_path, args, field):
    res = CliRunner().invoke(app, ["bench", "pfl-ditto", "--quick", "--out",
                                   str(tmp_path / "out"), "--results",
                                   str(tmp_path / "results"), *args])
    assert res.exit_code != 0 and field in res.output
    assert not (tmp_path / "results").exists()


def _half_unit(cell: str) -> float:
    """Half a unit of the last decimal a table cell prints: the most printing moves it."""
    return 0.5 * 10.0 ** -len(cell.partition(".")[2])


def test_quick_run_through_the_command_fills_every_column(tmp_path):
    results = tmp_path / "results"
    res = CliRunner().invoke(app, ["bench", "pfl-ditto", "--quick", "--cohorts", "2",
                                   "--groups", "1", "--warmup", "1", "--iterations", "1",
                                   "--out", str(tmp_path / "out"), "--results", str(results)])
    assert res.exit_code == 0, res.output
    text = (results / "RESULTS.md").read_text()
    assert "| " + " | ".join(HEADER) + " |" in text
    assert "torch " in text and "load average" in text and "command: `" in text
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| 2 |")]
    assert [r[1] for r in rows] == ["fedforge", "plain"]
    fedforge, plain = rows
    assert all(len(r) == len(HEADER) for r in rows)
    assert all(cell for cell in fedforge), fedforge  # every column filled
    # the cells against the row's own timed rounds before any rounding (its .out file), so
    # that no rounding and no speed of the machine can move them apart
    timed = json.loads((tmp_path / "out" / "fedforge-2.out").read_text())["iteration_s"]
    s = statistics.median(timed)
    assert s > 0 and float(fedforge[5]) > 50
    assert float(fedforge[3]) == pytest.approx(s, abs=0.0005 + _half_unit(fedforge[3]))
    assert float(fedforge[4]) == pytest.approx(2 / s, abs=0.05 + 1e-9)  # updates/s to 0.1
    assert 0 <= float(fedforge[6]) <= 1 and 0 <= float(fedforge[7]) <= 1
    assert fedforge[10].startswith("yes (")
    assert plain[8] == plain[9] == "1.00" and plain[10] == ""
    assert plain[6:8] == fedforge[6:8]  # the same models: the same accuracies
