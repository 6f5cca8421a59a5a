"""FedProto's local step on its own, by hand, in float64: one step on one batch whose sample
weights are not all 1 (one is 0, the padding), whose total weight is under 2, with rows at
different distances from their prototypes, a class without a prototype and a prototype table
that is not square (3 classes, d = 2).

The three-round reference (test_personal_fedproto.py) has only 0/1 weights, every batch of
weight >= 2 and plain SGD, so it cannot see a weight dividing instead of multiplying, the
clamp of the batch weight, the mean taken over the whole batch instead of per row, or the
local momentum. The setup makes the gradient a closed form: body = identity (f(x) = x), head
zero, so the logits are 0, the softmax is 1/3 and

    dz_b = (1/3 - e_{y_b}) w_b / n,    df_b = λ · 2 (f_b - C_{y_b}) m_b w_b / (n d),

with n = max(Σ w, 1), m_b = 1 where class y_b has a prototype.
"""

import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.client.transforms import RoundContext
from fedforge.protocol.step_batch import STEP_BATCH, StepBatch

F64 = torch.float64
X = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]], dtype=F64)
Y = torch.tensor([0, 2, 1, 0])
W = torch.tensor([1.0, 0.25, 0.0, 0.5], dtype=F64)  # row 2 is padding; Σ w = 1.75
PROTOS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=F64)  # [K=3, d=2]
PRESENT = torch.tensor([1.0, 1.0, 0.0], dtype=F64)  # class 2 has no prototype yet
LAM = 0.5


def _params():
    return {"0.weight": torch.eye(2, dtype=F64), "0.bias": torch.zeros(2, dtype=F64),
            "1.weight": torch.zeros(3, 2, dtype=F64), "1.bias": torch.zeros(3, dtype=F64)}


def _alg(**kw):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    alg = build_algorithm("fedproto", **{"local_lr": 1.0, "lam": LAM,
                                         "client_optimizer": "sgd", **kw})
    alg.bind_model(model)
    return alg


def _ctx(params, weights=W, protos=PROTOS, present=PRESENT, x=X, y=Y, batch=True):
    info = {STEP_BATCH: StepBatch(None, y, weights, y[None], weights[None], x)} if batch else {}
    return RoundContext(params, {"round": torch.tensor(1.0, dtype=F64),
                                 "fedproto": {"protos": protos, "present": present}}, {}, info)


def _step(alg, params, ctx, state=None):
    opt = alg.local_optimizer
    state = opt.init(params, ctx) if state is None else state
    return opt.step({k: torch.zeros_like(v) for k, v in params.items()}, state, params, ctx)


def _hand_gradient():
    """The closed form above, row by row (n = 1.75, d = 2)."""
    n, d = 1.75, 2
    g = {k: torch.zeros_like(v) for k, v in _params().items()}
    for b in range(4):
        w, c = W[b].item(), int(Y[b])
        dz = (torch.full((3,), 1 / 3, dtype=F64) - torch.eye(3, dtype=F64)[c]) * w / n
        df = LAM * 2 * (X[b] - PROTOS[c]) * PRESENT[c] * w / (n * d)
        g["1.weight"] += torch.outer(dz, X[b])
        g["1.bias"] += dz
        g["0.weight"] += torch.outer(df, X[b])  # head zero: the CE sends nothing to the body
        g["0.bias"] += df
    return g


def test_the_hand_gradient_is_the_one_written_out():
    """Pins the reference itself: rows 0 and 3 pull towards C_0 ([0, 2]/1.75 · 0.5 and
    [-3, 1]/1.75 · 0.25), row 1 has no prototype, row 2 weighs 0."""
    g = _hand_gradient()
    assert torch.allclose(g["0.bias"], torch.tensor([-3 / 7, 5 / 7], dtype=F64))
    assert torch.allclose(g["0.weight"], torch.tensor([[6 / 7, -3 / 7], [2 / 7, 9 / 7]],
                                                      dtype=F64))
    assert torch.allclose(g["1.bias"], torch.tensor([-11 / 21, 7 / 21, 4 / 21], dtype=F64))


@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64_model", "f32_model"])
def test_one_step_is_the_weighted_loss_gradient_and_weighted_class_sums(dtype):
    """SGD at lr 1 moves by minus the hand gradient; the class sums are Σ w_b f(x_b) (before
    the step) and the counts Σ w_b, in the features' dtype even where the mask is float64
    and the model float32 (the test drivers' masks are float64)."""
    alg = _alg()
    params = {k: v.to(dtype) for k, v in _params().items()}
    new, state = _step(alg, params, _ctx(params, protos=PROTOS.to(dtype),
                                         present=PRESENT.to(dtype), x=X.to(dtype)))
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == F64 else {"rtol": 1e-6, "atol": 1e-6}
    for k, g in _hand_gradient().items():
        assert new[k].dtype == dtype and torch.allclose(new[k].double(), params[k] - g, **tol), k
    want_sums = torch.tensor([[0.0, 2.5], [0.0, 0.0], [0.75, -0.25]], dtype=dtype)
    assert state["sums"].dtype == dtype and torch.equal(state["sums"], want_sums)
    assert torch.equal(state["counts"], torch.tensor([1.5, 0.0, 0.25], dtype=dtype))


def test_the_local_momentum_is_the_configured_one():
    """Heavy ball with β = local_momentum = 0.5 (not the optimizer's default 0.9): a second
    step on a batch of weight 0 (zero gradient) moves by β times the first step, and adds
    nothing to the sums."""
    alg, params = _alg(client_optimizer="momentum", local_momentum=0.5), _params()
    one, state = _step(alg, params, _ctx(params))
    zero = torch.zeros(4, dtype=F64)
    two, state = _step(alg, one, _ctx(one, weights=zero), state)
    for k, g in _hand_gradient().items():
        assert torch.allclose(two[k], params[k] - 1.5 * g, rtol=1e-12, atol=1e-14), k
    assert torch.equal(state["counts"], torch.tensor([1.5, 0.0, 0.25], dtype=F64))


def test_a_one_wide_representation_has_one_flag_and_count_per_class():
    """d = 1 (head [3, 1]): the server's flags and the client's counts are [K], not a
    column that does not exist."""
    model = nn.Sequential(nn.Linear(2, 1), nn.Linear(1, 3)).double()
    alg = build_algorithm("fedproto", local_lr=1.0, lam=LAM, client_optimizer="sgd")
    alg.bind_model(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    server = alg.broadcast(alg.server_init(params))["fedproto"]
    assert server["protos"].shape == (3, 1) and torch.equal(server["present"],
                                                            torch.zeros(3, dtype=F64))
    ctx = _ctx(params, protos=server["protos"], present=server["present"])
    assert torch.equal(alg.local_optimizer.init(params, ctx)["counts"],
                       torch.zeros(3, dtype=F64))
    _, state = _step(alg, params, ctx)
    assert torch.equal(state["counts"], torch.tensor([1.5, 0.0, 0.25], dtype=F64))


class _HeadFirst(nn.Module):
    """A classifier registered before its body, so the last registered layer is the body."""

    def __init__(self):
        super().__init__()
        self.fc, self.body = nn.Linear(2, 3), nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(self.body(x))


def test_the_features_are_at_the_input_of_the_named_head():
    """``head = ["fc.*"]``: f(x) = body(x) = 2x + 1 feeds the class sums, not x (the input of
    the last registered layer, which the default head would pick)."""
    model = _HeadFirst().double()
    alg = build_algorithm("fedproto", local_lr=1.0, lam=0.0, client_optimizer="sgd",
                          head=["fc.*"])
    alg.bind_model(model)
    params = {"fc.weight": torch.zeros(3, 2, dtype=F64), "fc.bias": torch.zeros(3, dtype=F64),
              "body.weight": 2 * torch.eye(2, dtype=F64), "body.bias": torch.ones(2, dtype=F64)}
    _, state = _step(alg, params, _ctx(params))
    hits = torch.eye(3, dtype=F64)[Y] * W[:, None]
    assert torch.allclose(state["sums"], hits.T @ (2 * X + 1))


def test_the_step_says_what_it_lacks():
    """Unbound: the one-line bind_model message; bound but without the step's batch: the
    error names the method."""
    alg, params = build_algorithm("fedproto"), _params()
    ctx = _ctx(params)
    state = alg.local_optimizer.init(params, ctx)
    with pytest.raises(ValueError, match=r"^fedproto: call algorithm\.bind_model\(model\) "
                                         r"first \(the runner does\)$"):
        alg.local_optimizer.step(params, state, params, ctx)
    alg = _alg()
    with pytest.raises(ValueError, match=r"^algorithm 'fedproto': its local step needs the "
                                         r"step's batch"):
        alg.local_optimizer.step(params, state, params, _ctx(params, batch=False))


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_a_non_negative_lambda_is_accepted(lam):
    """λ = 0 (plain local CE) and a λ below 1 (the code's 0.1 for CIFAR-10) both build."""
    assert build_algorithm("fedproto", lam=lam).name == "fedproto"


def test_a_negative_lambda_is_refused_by_its_field():
    with pytest.raises(ValueError, match=r"^algorithm\.lam: expected lam >= 0, got -0\.1$"):
        build_algorithm("fedproto", lam=-0.1)
