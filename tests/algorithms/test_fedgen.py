"""FedGen against an independent float64 reference over three rounds, written from the
official code (zhuangdizhu/FedGen ``userpFedGen.py``, ``serverpFedGen.py``) with torch's own
modules: ``nn.Linear``, ``nn.BatchNorm1d`` (batch statistics while the server trains,
running statistics on the clients), ``torch.optim.Adam`` with weight decay and
``ExponentialLR``, the code's ``NLLLoss(reduce=False) * weight[B, 1]`` broadcast and its
``DiversityLoss('l1')`` written out. Only the shared randomness is taken from fedforge, as
data: the generator's initial weights, the clients' keys of the round (their latents and
drawn labels are the counter hashes of ``(key, step, stream)``) and the server's seed.

Model: body ``h = W0 x + b0`` (2 -> 2), head ``logits = W1 h + b1`` (2 -> 3 classes); the
generator maps 2 noise values and the one-hot label through 3 hidden units to h's width 2.
Round 1 trains clients 0 and 2 with no regulariser, then the server trains the generator on
their heads; rounds 2 and 3 regularise with it (client 1's second step is padding, one batch
is partly padding). The label counts differ by client, so weighting the clients uniformly
instead of by label counts changes the generator.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.comm.rng import randint, stream_key, uniform
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.local import classification_loss
from fedforge.engine.round import RoundSetup, federated_round
from tests.algorithms.personal_rounds import batches

X = torch.tensor([[1.0, 0.5], [0.2, -1.0], [-0.7, 0.3], [0.4, 0.9], [-1.2, 0.1], [0.6, -0.4],
                  [0.3, 0.3], [-0.5, -0.8], [1.1, -0.2]], dtype=torch.float64)
Y = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1, 1])
INIT = {"0.weight": [[0.5, -0.3], [0.2, 0.8]], "0.bias": [0.1, -0.2],
        "1.weight": [[0.4, -0.6], [-0.2, 0.3], [0.7, 0.1]], "1.bias": [0.0, 0.1, -0.1]}
SIZES = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)  # n_i: the models' weights
SCHEDULE = [  # per round: cohort and each client's [steps, batch] sample indices (-1: padding)
    ([0, 2], [[[0, 1, 2], [2, 0, 1]], [[6, 7, 8], [8, 6, 7]]]),
    ([1, 2], [[[3, 4, 5], [5, -1, -1]], [[7, 8, 6], [-1, -1, -1]]]),
    ([1, 2, 0], [[[4, 5, 3], [3, 5, 4]], [[6, 8, 7], [7, 6, -1]], [[2, 1, 0], [1, 0, 2]]]),
]
HP = {"local_lr": 0.3, "alpha": 2.0, "beta": 1.5, "decay": 0.9, "gen_batch_size": 4,
      "generator_lr": 0.05, "generator_lr_decay": 0.7, "generator_weight_decay": 0.1,
      "generator_steps": 3, "generator_batch_size": 4, "eta": 0.5, "noise_dim": 2,
      "hidden_dim": 3, "seed": 3}
K, NOISE = 3, 2


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.tensor(INIT[k], dtype=torch.float64))
    return model


def _fedforge(engine=LoopEngine, base=HP, **hparams):
    """fedforge's global model and generator after each round, and each round's draws."""
    model = _model()
    alg = build_algorithm("fedgen", **{**base, **hparams})
    alg.bind_model(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    state, store = alg.server_init(params), ClientStore(3, alg.client_init(params))
    init = {k: v.clone() for k, v in state["parts"]["fedgen"]["generator"].items()}
    out, keys = [], []
    for t, (ids, idx, weights) in enumerate(batches(SCHEDULE), start=1):
        info = alg.round_info(len(ids), torch.Generator().manual_seed(t))
        sizes = SIZES[ids]
        draw = RoundDraw(ids, idx, weights, sizes / sizes.sum(), info=info, round=t)
        params, state, _ = federated_round(
            RoundSetup(alg, engine(), classification_loss(model), store, X, Y), params,
            state, draw)
        gen = state["parts"]["fedgen"]
        out.append(({k: v.clone() for k, v in params.items()},
                    {**gen["generator"], **{f"stats.{k}": v for k, v in gen["stats"].items()}}))
        keys.append(info["fedgen_key"])
    return out, init, keys


class RefGenerator(nn.Module):
    """The code's Generator: [ε, onehot(y)] -> Linear -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self, init: dict) -> None:
        super().__init__()
        self.fc, self.bn, self.out = nn.Linear(NOISE + K, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)
        self.double()
        with torch.no_grad():
            for k, p in self.named_parameters():
                p.copy_(init[k])

    def forward(self, labels, eps):
        onehot = torch.zeros(len(labels), K, dtype=torch.float64)
        onehot.scatter_(1, labels.view(-1, 1), 1)
        return self.out(torch.relu(self.bn(self.fc(torch.cat([eps, onehot], 1)))))


def _code_diversity(eps, z):
    """generator.py DiversityLoss(metric='l1'): exp(mean(−noise_dist · layer_dist))."""
    n = z.size(0)
    layer = torch.abs(z.expand((n, n, z.size(1))) - z.unsqueeze(1)).mean(dim=(2,))
    noise = torch.pow(eps.expand((n, n, eps.size(1))) - eps.unsqueeze(1), 2).mean(dim=(2,))
    return torch.exp(torch.mean(-noise * layer))


def _client(model, gen, key, idx, weights, t, mutant):
    """userpFedGen.train: SGD steps on CE + gen_ratio·α_t·teacher + β_t·latent from round 2."""
    local = copy.deepcopy(model)
    gen.eval()
    for k in range(idx.shape[0]):
        w = weights[k]
        if w.sum() == 0:
            continue  # a padded step changes nothing
        x, y = X[idx[k]], Y[idx[k]]
        logq = F.log_softmax(local(x), 1)
        n = w.sum().clamp_min(1.0)
        loss = -(logq[torch.arange(len(y)), y] * w).sum() / n
        if t > 1:
            alpha = max(1e-4, HP["alpha"] * HP["decay"] ** (t - 1))
            beta = max(1e-4, HP["beta"] * HP["decay"] ** (t - 1))
            eps = uniform(stream_key(key, k, 0), torch.arange(len(y) * NOISE),
                          torch.float64).view(-1, NOISE)
            with torch.no_grad():
                target = F.softmax(local[1](gen(y, eps)), 1)
            latent = (torch.special.xlogy(target, target) - target * logq).sum(1)
            drawn = randint(stream_key(key, k, 1), torch.arange(HP["gen_batch_size"]), K)
            eps = uniform(stream_key(key, k, 2), torch.arange(HP["gen_batch_size"] * NOISE),
                          torch.float64).view(-1, NOISE)
            with torch.no_grad():
                z = gen(drawn, eps)
            teacher = F.nll_loss(F.log_softmax(local[1](z), 1), drawn)
            sign = -1.0 if mutant == "latent_sign" else 1.0
            loss = loss + HP["gen_batch_size"] / len(y) * alpha * teacher \
                + sign * beta * (latent * w).sum() / n
        grads = torch.autograd.grad(loss, list(local.parameters()))
        with torch.no_grad():
            for p, g in zip(local.parameters(), grads, strict=True):
                p -= HP["local_lr"] * g
    counts = 1 + (F.one_hot(Y[idx], K).double() * weights.unsqueeze(-1)).sum((0, 1))
    return local, counts


def _train_generator(gen, opt, heads, counts, t, mutant, weighting):
    """serverpFedGen.train_generator: Adam steps on α·teacher + η·diversity."""
    c = torch.stack(counts)  # [S, K]
    lw = (c / c.sum(0)).T if mutant != "uniform_weights" else torch.full((K, len(heads)),
                                                                         1 / len(heads))
    qualified = torch.nonzero(c.max(0).values > 1).flatten()
    g = torch.Generator().manual_seed(int(stream_key(HP["seed"], t)))
    gen.train()
    for _ in range(HP["generator_steps"]):
        opt.zero_grad()
        pick = torch.randint(0, len(qualified), (HP["generator_batch_size"],), generator=g)
        y = qualified[pick]
        eps = torch.rand(len(y), NOISE, generator=g, dtype=torch.float64)
        z = gen(y, eps)
        teacher = 0
        for s, (w, b) in enumerate(heads):
            weight = lw[y][:, s].reshape(-1, 1)  # the code's [B, 1]
            nll = F.nll_loss(F.log_softmax(F.linear(z, w, b), 1), y, reduction="none")
            teacher = teacher + torch.mean(nll * (weight if weighting == "batch"
                                                  else weight.flatten()))
        eta = 0.0 if mutant == "no_diversity" else HP["eta"]
        (teacher + eta * _code_diversity(eps, z)).backward()
        opt.step()


def reference(init, keys, mutant=None, weighting="batch"):
    """The global model and the generator after each round."""
    model, gen = _model(), RefGenerator(init)
    opt = torch.optim.Adam(gen.parameters(), lr=HP["generator_lr"], betas=(0.9, 0.999),
                           eps=1e-8, weight_decay=HP["generator_weight_decay"])
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=HP["generator_lr_decay"])
    out = []
    for t, ((ids, idx, weights), key) in enumerate(zip(batches(SCHEDULE), keys), start=1):
        trained = [_client(model, gen, key[i], idx[i], weights[i], t, mutant)
                   for i in range(len(ids))]
        share = SIZES[ids] / SIZES[ids].sum()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(sum(a * dict(m.named_parameters())[name]
                            for a, (m, _) in zip(share, trained, strict=True)))
        if mutant != "untrained":
            heads = [(m[1].weight.detach(), m[1].bias.detach()) for m, _ in trained]
            _train_generator(gen, opt, heads, [c for _, c in trained], t, mutant, weighting)
            sched.step()
        out.append(({k: v.detach().clone() for k, v in model.named_parameters()},
                    {**{k: v.detach().clone() for k, v in gen.named_parameters()},
                     "stats.mean": gen.bn.running_mean.clone(),
                     "stats.var": gen.bn.running_var.clone()}))
    return out


def _close(a, b, tol=1e-9):
    return all(torch.allclose(a[k], b[k], rtol=tol, atol=tol) for k in b)


ENGINES = {"loop": LoopEngine, "vmap": lambda: VmapEngine(chunk_size=2)}


@pytest.mark.parametrize("engine", ENGINES)
def test_three_rounds_match_the_reference(engine):
    got, init, keys = _fedforge(ENGINES[engine])
    want = reference(init, keys)
    for t, ((params, gen), (ref_params, ref_gen)) in enumerate(zip(got, want, strict=True), 1):
        assert _close(params, ref_params), f"round {t}: model"
        assert _close(gen, ref_gen), f"round {t}: generator"


def test_per_sample_label_weighting_matches_its_reference():
    got, init, keys = _fedforge(label_weighting="sample")
    want = reference(init, keys, weighting="sample")
    assert _close(got[-1][0], want[-1][0]) and _close(got[-1][1], want[-1][1])


@pytest.mark.parametrize("mutant", ["uniform_weights", "no_diversity", "latent_sign",
                                    "untrained", "sample_weighting"])
def test_wrong_variants_miss_fedforges_trajectory(mutant):
    """Each wrong rule gives another generator after round 1 or another model by round 3."""
    got, init, keys = _fedforge()
    assert _close(got[-1][0], reference(init, keys)[-1][0])
    wrong = reference(init, keys, mutant=None if mutant == "sample_weighting" else mutant,
                      weighting="sample" if mutant == "sample_weighting" else "batch")
    assert not (_close(got[-1][0], wrong[-1][0], 1e-6) and _close(got[-1][1], wrong[-1][1],
                                                                  1e-6))


def test_round_one_is_fedavg_and_the_generator_trains_after_it():
    got, init, _ = _fedforge()
    params, gen = got[0]
    fedavg = build_algorithm("fedavg", local_lr=HP["local_lr"])
    model = _model()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    ids, idx, weights = batches(SCHEDULE)[0]
    sizes = SIZES[ids]
    want, _, _ = federated_round(
        RoundSetup(fedavg, LoopEngine(), classification_loss(model),
                   ClientStore(3, fedavg.client_init(start)), X, Y), start,
        fedavg.server_init(start), RoundDraw(ids, idx, weights, sizes / sizes.sum(), round=1))
    assert _close(params, want)
    assert not _close({k: gen[k] for k in init}, init)


def test_defaults_in_effect_equal_the_table():
    """Built without arguments, FedGen trains exactly as with the table's values passed."""
    from fedforge.algorithms.defaults import ALGORITHM_DEFAULTS

    table = {k: d.value for k, d in ALGORITHM_DEFAULTS["fedgen"].items()}
    implicit, explicit = _fedforge(base={})[0], _fedforge(base=table)[0]
    for (a, ga), (b, gb) in zip(implicit, explicit, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_bytes_count_the_generator_down_and_the_label_counts_up():
    alg = build_algorithm("fedgen", **HP)
    alg.bind_model(_model())
    params = {k: v.detach() for k, v in _model().named_parameters()}
    model_bytes = sum(v.numel() for v in params.values()) * 8  # 15 float64
    generator = (5 * 3 + 3) + 3 + 3 + (3 * 2 + 2) + 3 + 3  # weights, BN scale/shift, stats
    assert alg.message_nbytes(params, alg.server_init(params)) == (
        model_bytes + generator * 8, model_bytes + K * 8)


def test_the_generators_state_is_server_state_and_clients_keep_nothing():
    alg = build_algorithm("fedgen", **HP)
    alg.bind_model(_model())
    params = {k: v.detach() for k, v in _model().named_parameters()}
    state = alg.server_init(params)["parts"]["fedgen"]
    assert sorted(state) == ["adam", "generator", "stats"]
    assert state["generator"]["out.weight"].shape == (2, 3)  # the head's input width
    assert state["generator"]["fc.weight"].shape == (3, NOISE + K)
    assert alg.client_init(params) == {}
    assert sorted(alg.broadcast(alg.server_init(params))["fedgen"]) == ["generator", "stats"]


class Scaled(nn.Module):
    """A head with one 2-d weight that is not an nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 2))

    def forward(self, h):
        return h @ self.weight.T * 2


def test_a_model_without_a_linear_head_is_refused_in_one_line():
    alg = build_algorithm("fedgen")
    with pytest.raises(ValueError, match=r"^fedgen: the model's head '1' must be one "
                                         r"nn.Linear layer .*, got Scaled$"):
        alg.bind_model(nn.Sequential(nn.Linear(2, 2), Scaled()))
    alg = build_algorithm("fedgen", head=["0.*", "1.*"])
    with pytest.raises(ValueError, match="fedgen: the model's head must be one linear layer"):
        alg.bind_model(_model())


def test_an_unbound_model_is_refused_in_one_line():
    alg = build_algorithm("fedgen", **HP)
    params = {k: v.detach() for k, v in _model().named_parameters()}
    ids, idx, weights = batches(SCHEDULE)[0]
    setup = RoundSetup(alg, LoopEngine(), classification_loss(_model()),
                       ClientStore(3, alg.client_init(params)), X, Y)
    with pytest.raises(ValueError, match=r"^fedgen: call algorithm.bind_model\(model\) first"):
        federated_round(setup, params, alg.server_init(params), RoundDraw(
            ids, idx, weights, info=alg.round_info(2, torch.Generator().manual_seed(0))))


@pytest.mark.parametrize(("field", "value"), [
    ("alpha", -1.0), ("beta", -0.1), ("eta", -1.0), ("generator_weight_decay", -1.0),
    ("decay", 0.0), ("generator_lr_decay", 1.5), ("gen_batch_size", 0),
    ("generator_steps", 0), ("generator_batch_size", 1.5), ("noise_dim", 0),
    ("hidden_dim", 0), ("generator_lr", 0.0), ("label_weighting", "mean")])
def test_refusals_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^algorithm\.{field}: expected"):
        build_algorithm("fedgen", **{field: value})


def test_label_weights_and_qualified_labels():
    from fedforge.algorithms.fedgen import label_weights

    counts = torch.tensor([[3.0, 1.0, 1.0], [1.0, 1.0, 2.0], [0.0, 0.0, 0.0]])  # 3rd: empty
    w, qualified = label_weights(counts)
    assert torch.allclose(w, torch.tensor([[0.75, 0.25, 0.0], [0.5, 0.5, 0.0],
                                           [1 / 3, 2 / 3, 0.0]]))
    assert qualified.tolist() == [0, 2]  # label 1: nobody saw it (counts 1 = the smoothing)
    np.testing.assert_allclose(w.sum(1).numpy(), 1.0)
