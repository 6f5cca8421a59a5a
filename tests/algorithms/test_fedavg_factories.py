"""The factories of the FedAvg and FedOpt families, FedExP, FedDyn and FedDC pass every
argument to the right place (src/fedforge/algorithms/{fedavg,fedopt,fedexp,feddyn,feddc}.py).

Each factory is built with distinct non-default values, and its local optimizer and server
optimizer are run on fixed gradients next to the same pieces built directly, so a dropped,
swapped or changed argument moves a number. The rules themselves have their own hand
references (test_multiround_sgd.py, test_fedopt.py, tests/server); the defaults are pinned by
test_defaults.py (docs/testing.md).
"""

from pathlib import Path

import pytest
import torch

from fedforge.algorithms.fedavg import fedavg, fedavgm, fedprox
from fedforge.algorithms.feddc import DriftCorrection, add_drift_correction, feddc
from fedforge.algorithms.feddyn import DynamicRegularizer, add_dynamic_regularizer, feddyn
from fedforge.algorithms.fedexp import (
    ExtrapolationStats,
    extrapolation,
    fedexp,
    fedexp_step_size,
)
from fedforge.algorithms.fedopt import fedadagrad, fedadam, fedams, fedyogi
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, add_prox, chain
from fedforge.server.chain import Aggregate
from fedforge.server.optimizers import (
    server_adagrad,
    server_adam,
    server_sgd,
    server_yogi,
)
from tests.algorithms.factory_paths import F64, X0, same, server_path
from tests.algorithms.factory_paths import local_path as shared_local_path

GLOBAL = {"w": torch.tensor([1.0, 1.0], dtype=F64)}
GRADS = [[30.0, 40.0], [0.5, -0.25], [0.0, 0.0]]  # the first is clipped at 5
CLIENT_STATE = {
    "feddyn": {"grad": {"w": torch.tensor([0.5, -1.0], dtype=F64)}},
    "feddc": {"h": {"w": torch.tensor([0.25, 0.5], dtype=F64)},
              "G": {"w": torch.tensor([-1.0, 2.0], dtype=F64)}},
}
BROADCAST = {"round": torch.tensor(1.0, dtype=F64),
             "feddc": {"G": {"w": torch.tensor([0.5, 0.5], dtype=F64)}}}


def local_path(tx):
    """Iterates of a local optimizer from X0 on GRADS (global model GLOBAL)."""
    return shared_local_path(tx, RoundContext(GLOBAL, BROADCAST, CLIENT_STATE, {}), GRADS)


LOCAL = dict(weight_decay=0.3, max_grad_norm=5.0)


@pytest.mark.parametrize("opt,nar", [("momentum", False), ("momentum", True), ("adam", False)])
def test_fedavg_passes_every_argument(opt, nar):
    alg = fedavg(local_lr=0.05, server_lr=0.7, client_optimizer=opt, local_momentum=0.3,
                 nar=nar, **LOCAL)
    assert alg.name == "fedavg" and alg.aggregation == "num_samples" and alg.parts == ()
    same(local_path(alg.local_optimizer),
         local_path(local_optimizer(opt, 0.05, momentum=0.3, nar=nar, **LOCAL)))
    same(server_path(alg.server_optimizer), server_path(server_sgd(0.7)))


def test_fedavg_local_momentum_reaches_the_client():
    a = fedavg(local_lr=0.05, client_optimizer="momentum", local_momentum=0.3)
    b = fedavg(local_lr=0.05, client_optimizer="momentum", local_momentum=0.6)
    assert not torch.allclose(local_path(a.local_optimizer), local_path(b.local_optimizer))
    # the default local momentum is 0.9 (torch.optim.SGD's usual value)
    same(local_path(fedavg(local_lr=0.05, client_optimizer="momentum").local_optimizer),
         local_path(local_optimizer("momentum", 0.05, momentum=0.9)))


@pytest.mark.parametrize("nar", [False, True])
def test_fedavgm_passes_every_argument(nar):
    alg = fedavgm(local_lr=0.05, server_lr=0.7, server_momentum=0.4,
                  client_optimizer="momentum", nar=nar, **LOCAL)
    assert alg.name == "fedavg_server_momentum" and alg.aggregation == "num_samples"
    same(local_path(alg.local_optimizer),
         local_path(local_optimizer("momentum", 0.05, nar=nar, **LOCAL)))
    same(server_path(alg.server_optimizer), server_path(server_sgd(0.7, momentum=0.4)))


@pytest.mark.parametrize("nar", [False, True])
def test_fedprox_passes_every_argument(nar):
    alg = fedprox(local_lr=0.05, mu=0.6, server_lr=0.7, client_optimizer="momentum", nar=nar,
                  **LOCAL)
    assert alg.name == "fedprox" and alg.aggregation == "num_samples"
    same(local_path(alg.local_optimizer),
         local_path(chain(add_prox(0.6), local_optimizer("momentum", 0.05, nar=nar, **LOCAL))))
    same(server_path(alg.server_optimizer), server_path(server_sgd(0.7)))


def test_fedprox_mu():
    fedprox(mu=0.0)  # no proximal term is allowed
    with pytest.raises(ValueError, match=r"^algorithm\.mu: expected mu >= 0, got -0\.1$"):
        fedprox(mu=-0.1)


@pytest.mark.parametrize("rule", ["textbook", "fednar_code"])
def test_fedadam_passes_every_argument(rule):
    alg = fedadam(local_lr=0.05, server_lr=0.7, b1=0.5, b2=0.8, tau=0.05,
                  client_optimizer="momentum", nar=True, adam_rule=rule, **LOCAL)
    assert alg.name == "fedadam" and alg.aggregation == "uniform"
    same(local_path(alg.local_optimizer),
         local_path(local_optimizer("momentum", 0.05, nar=True, **LOCAL)))
    same(server_path(alg.server_optimizer), server_path(server_adam(0.7, 0.5, 0.8, 0.05,
                                                                    rule=rule)))


def test_fedyogi_fedadagrad_fedams_pass_every_argument():
    direct = local_path(local_optimizer("momentum", 0.05, nar=True, **LOCAL))
    kw = dict(local_lr=0.05, client_optimizer="momentum", nar=True, **LOCAL)
    yogi = fedyogi(server_lr=0.7, b1=0.5, b2=0.8, tau=0.05, **kw)
    adagrad = fedadagrad(server_lr=0.7, tau=0.05, **kw)
    ams = fedams(server_lr=0.7, b1=0.5, b2=0.8, eps=0.05, **kw)
    for alg, name in [(yogi, "fedyogi"), (adagrad, "fedadagrad"), (ams, "fedams")]:
        assert alg.name == name and alg.aggregation == "uniform"
        same(local_path(alg.local_optimizer), direct)
    same(server_path(yogi.server_optimizer), server_path(server_yogi(0.7, 0.5, 0.8, 0.05)))
    same(server_path(adagrad.server_optimizer), server_path(server_adagrad(0.7, 0.05)))
    same(server_path(ams.server_optimizer),
         server_path(server_adam(0.7, 0.5, 0.8, amsgrad=True, floor=0.05)))


def test_fedexp_passes_every_argument():
    alg = fedexp(local_lr=0.05, eps=0.25, client_optimizer="momentum", nar=True, **LOCAL)
    assert alg.name == "fedexp" and alg.aggregation == "uniform"
    assert [type(p) for p in alg.parts] == [ExtrapolationStats]
    same(local_path(alg.local_optimizer),
         local_path(local_optimizer("momentum", 0.05, nar=True, **LOCAL)))
    # eps reaches the server stage: ½ · 8 / (||(1, 1)||² + 2 · 0.25) = 1.6
    stage = alg.server_optimizer
    params = {"w": torch.tensor([3.0, 3.0], dtype=F64)}
    agg = Aggregate({"w": torch.tensor([1.0, 1.0], dtype=F64)},
                    {"fedexp": {"sq_norm": torch.tensor(8.0, dtype=F64)}}, 2, 10, 1)
    new, _, state = stage.update(params, agg, stage.init(params))
    same(state["eta_g"], torch.tensor(1.6, dtype=F64))
    same(new["w"], torch.tensor([1.4, 1.4], dtype=F64))


def test_fedexp_stage_state_and_evaluation_point():
    """init: prev = x, round 0, η 1 (float64); after a step prev is the old x, round 1."""
    stage = extrapolation(0.0)
    x = {"w": torch.tensor([3.0, 3.0])}
    st = stage.init(x)
    assert st["round"].dtype == F64 and st["round"].item() == 0.0
    assert st["eta_g"].dtype == F64 and st["eta_g"].item() == 1.0
    assert st["prev"]["w"].tolist() == [3.0, 3.0] and st["prev"]["w"] is not x["w"]
    agg = Aggregate({"w": torch.tensor([1.0, 0.0])},
                    {"fedexp": {"sq_norm": torch.tensor(4.0)}}, 1, 10, 1)
    x1, _, st = stage.update(x, agg, st)
    assert x1["w"].tolist() == [1.0, 3.0]  # η = ½ · 4 / 1 = 2
    assert st["round"].item() == 1.0 and st["prev"]["w"].tolist() == [3.0, 3.0]
    assert stage.eval_params(x1, st)["w"].tolist() == [1.0, 3.0]  # round 1: x^1
    x2, _, st = stage.update(x1, agg, st)
    assert x2["w"].tolist() == [-1.0, 3.0] and st["round"].item() == 2.0
    assert stage.eval_params(x2, st)["w"].tolist() == [0.0, 3.0]  # (x^2 + x^1) / 2


def test_fedexp_step_size_edges():
    delta = {"w": torch.tensor([1.0, 0.0], dtype=F64)}
    same(fedexp_step_size(torch.tensor(6.0, dtype=F64), delta, 2, 0.5), torch.tensor(1.5,
                                                                                   dtype=F64))
    same(fedexp_step_size(torch.tensor(1.0, dtype=F64), delta, 2, 0.5), torch.tensor(1.0,
                                                                                   dtype=F64))
    zero = {"w": torch.zeros(2, dtype=F64)}
    same(fedexp_step_size(torch.tensor(0.0, dtype=F64), zero, 3, 0.0), torch.tensor(1.0,
                                                                                  dtype=F64))


def test_feddyn_passes_every_argument():
    alg = feddyn(local_lr=0.05, alpha=0.3, client_optimizer="momentum", local_momentum=0.2,
                 weight_decay=0.4)
    assert alg.name == "feddyn" and alg.hparams == {"alpha": 0.3}
    assert alg.aggregation == "uniform"
    assert [type(p) for p in alg.parts] == [DynamicRegularizer] and alg.parts[0].alpha == 0.3
    same(local_path(alg.local_optimizer),
         local_path(chain(add_dynamic_regularizer(0.3),
                          local_optimizer("momentum", 0.05, momentum=0.2, weight_decay=0.4))))
    same(server_path(alg.server_optimizer), server_path(server_sgd(1.0)))
    # the default local momentum is 0.5 (not the local optimizer's 0.9)
    same(local_path(feddyn(local_lr=0.05, alpha=0.3, client_optimizer="momentum")
                    .local_optimizer),
         local_path(chain(add_dynamic_regularizer(0.3),
                          local_optimizer("momentum", 0.05, momentum=0.5))))


def test_feddyn_regularizer_and_part_by_hand():
    """g - g_i + α (θ - θ^t): g = 0, g_i = (0.5, -1), θ = (3, -4), θ^t = (1, 1), α = 0.3."""
    tx = add_dynamic_regularizer(0.3)
    ctx = RoundContext(GLOBAL, BROADCAST, CLIENT_STATE, {})
    out, _ = tx.update({"w": torch.zeros(2, dtype=F64)}, tx.init({}, ctx), {"w": X0}, ctx)
    same(out["w"], torch.tensor([-0.5 + 0.6, 1.0 - 1.5], dtype=F64))
    part = DynamicRegularizer(0.5)
    same(part.adjust_params({"w": torch.tensor([1.0, 1.0], dtype=F64)},
                            {"h": {"w": torch.tensor([0.5, -1.0], dtype=F64)}})["w"],
         torch.tensor([0.0, 3.0], dtype=F64))  # θ - h/α
    with pytest.raises(ValueError, match=r"^algorithm\.alpha: expected alpha > 0, got 0$"):
        feddyn(alpha=0)


def test_feddc_passes_every_argument():
    alg = feddc(local_lr=0.05, alpha=0.3, client_optimizer="momentum", local_momentum=0.2,
                weight_decay=0.4)
    assert alg.name == "feddc" and alg.hparams == {"alpha": 0.3}
    assert alg.aggregation == "uniform"
    assert [type(p) for p in alg.parts] == [DriftCorrection]
    same(local_path(alg.local_optimizer),
         local_path(chain(add_drift_correction(0.3),
                          local_optimizer("momentum", 0.05, momentum=0.2, weight_decay=0.4))))
    same(server_path(alg.server_optimizer), server_path(server_sgd(1.0)))
    same(local_path(feddc(local_lr=0.05, alpha=0.3, client_optimizer="momentum")
                    .local_optimizer),
         local_path(chain(add_drift_correction(0.3),
                          local_optimizer("momentum", 0.05, momentum=0.5))))
    feddc(alpha=0.0)  # no drift penalty is allowed
    with pytest.raises(ValueError, match=r"^algorithm\.alpha: expected alpha >= 0, got -1$"):
        feddc(alpha=-1)


def test_feddc_correction_by_hand():
    """g + α (θ + h_i - w) + G - G_i with g = 0, θ = (3, -4), h_i = (0.25, 0.5), w = (1, 1),
    G = (0.5, 0.5), G_i = (-1, 2), α = 0.3."""
    tx = add_drift_correction(0.3)
    ctx = RoundContext(GLOBAL, BROADCAST, CLIENT_STATE, {})
    out, _ = tx.update({"w": torch.zeros(2, dtype=F64)}, tx.init({}, ctx), {"w": X0}, ctx)
    same(out["w"], torch.tensor([0.3 * 2.25 + 1.5, 0.3 * -4.5 - 1.5], dtype=F64))
    part = DriftCorrection(0.1)
    assert part.broadcast({"G": 7, "hbar": 8}) == {"G": 7}
    same(part.adjust_params({"w": torch.tensor([1.0, 1.0], dtype=F64)},
                            {"hbar": {"w": torch.tensor([0.5, -1.0], dtype=F64)}})["w"],
         torch.tensor([1.5, 0.0], dtype=F64))


def test_schedule_arguments_are_named_in_errors():
    with pytest.raises(ValueError, match=r"^eps: expected a number or a schedule"):
        extrapolation(True)
    with pytest.raises(ValueError, match=r"^local_lr: expected a number or a schedule"):
        DriftCorrection(True)


def test_message_sizes():
    """Model of 2 float64 = 16 bytes: FedExP uploads one scalar besides the delta (counted
    as 0 models), FedDC receives G and uploads dG (one model each way), FedDyn nothing."""
    params = {"w": torch.zeros(2, dtype=F64)}
    for alg, sizes in [(fedexp(), (16, 16)), (feddc(), (32, 32)), (feddyn(), (16, 16)),
                       (fedavg(), (16, 16))]:
        assert alg.message_nbytes(params, alg.server_init(params)) == sizes, alg.name


def test_descriptions_are_the_documented_ones():
    """What ``fedforge algorithms`` prints is the list in docs/algorithms.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    for alg in (fedavg(), fedavgm(), fedprox(), fedadam(), fedyogi(), fedadagrad(), fedams(),
                fedexp(), feddyn(), feddc()):
        assert f"\nsync: {alg.description}\n" in page, alg.name


def test_fedexp_defaults_and_cancelling_deltas():
    """eps = 1e-3 by default: S = 1, Δ̄ = (1, 0), mean ||Δ_i||² = 4 -> η = 2 / 1.001. Deltas
    that cancel (Δ̄ = 0) with ε = 0: the step size is 1, not ½ mean ||Δ_i||²."""
    x = {"w": torch.tensor([3.0, 3.0])}
    agg = Aggregate({"w": torch.tensor([1.0, 0.0])},
                    {"fedexp": {"sq_norm": torch.tensor(4.0)}}, 1, 10, 1)
    for stage in (extrapolation(), fedexp().server_optimizer):
        _, _, st = stage.update(x, agg, stage.init(x))
        assert st["eta_g"].dtype == F64  # float32 model, float64 log
        assert st["eta_g"].item() == pytest.approx(2 / 1.001, rel=1e-6)
    zero = {"w": torch.zeros(2, dtype=F64)}
    same(fedexp_step_size(torch.tensor(6.0, dtype=F64), zero, 2, 0.0),
         torch.tensor(1.0, dtype=F64))
