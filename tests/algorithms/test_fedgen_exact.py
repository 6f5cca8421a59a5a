"""FedGen's pieces on their own, by hand: the generator's initialisation, batch normalisation
and diversity loss, the label weights, the teacher loss, Adam's start, the cohort's label
counts and slots, a client's uploads and local loss, and the round's keys.

The three-round reference (test_fedgen.py) takes the generator's initial weights and the
round's keys from fedforge as data and runs one float64 model with a biased last-layer head,
so it cannot see how those are drawn, a head without a bias or under a submodule, a float32
model, or a cohort in which one label (or none) qualifies.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.fedgen import (
    COUNTS,
    KEY,
    SLOT,
    label_weights,
    teacher_loss,
    train_generator,
)
from fedforge.algorithms.generator import (
    adam_init,
    adam_step,
    diversity_loss,
    generate,
    init_generator,
)
from fedforge.client.transforms import RoundContext
from fedforge.comm.rng import randint, stream_key, uniform
from fedforge.protocol.algorithm import LOCAL_STEP, FinalizeInputs, PrepareInputs
from fedforge.server.chain import Aggregate

F64, F32 = torch.float64, torch.float32
HP = {"alpha": 2.0, "beta": 1.5, "decay": 0.9, "gen_batch_size": 3, "generator_lr": 0.05,
      "generator_lr_decay": 0.7, "generator_weight_decay": 0.1, "generator_steps": 2,
      "generator_batch_size": 4, "eta": 0.5, "noise_dim": 2, "hidden_dim": 4, "seed": 3}


def _part(**kw):
    return build_algorithm("fedgen", **{**HP, **kw}).parts[0]


def _params(dtype=F64, bias=True):
    """Body 2 -> 2, head 2 -> 3 classes (``[K, d]`` = ``[3, 2]``)."""
    p = {"0.weight": torch.tensor([[0.5, -0.3], [0.2, 0.8]]), "0.bias": torch.tensor([0.1, -0.2]),
         "1.weight": torch.tensor([[0.4, -0.6], [-0.2, 0.3], [0.7, 0.1]])}
    if bias:
        p["1.bias"] = torch.tensor([0.0, 0.1, -0.1])
    return {k: v.to(dtype) for k, v in p.items()}


# --- the generator --------------------------------------------------------------------------

def _uniform_linear(g, fan_in, fan_out):
    """nn.Linear's U(±1/√fan_in), drawn in float64: weight then bias."""
    bound = 1 / math.sqrt(fan_in)
    w = torch.rand(fan_out, fan_in, generator=g, dtype=F64) * 2 * bound - bound
    return w, torch.rand(fan_out, generator=g, dtype=F64) * 2 * bound - bound


def test_init_draws_nn_linears_uniforms_from_the_seed_in_float64():
    """Weights U(±1/√fan_in) in the order fc.weight, fc.bias, out.weight, out.bias from one
    generator seeded by ``seed``; BN scale 1, shift 0; running mean 0, variance 1."""
    gen = init_generator(2, 3, 4, 6, seed=7, like=torch.zeros((), dtype=F64))
    g = torch.Generator().manual_seed(7)
    fc_w, fc_b = _uniform_linear(g, 5, 4)  # fan_in = noise 2 + 3 classes
    out_w, out_b = _uniform_linear(g, 4, 6)
    want = {"fc.weight": fc_w, "fc.bias": fc_b, "bn.weight": torch.ones(4, dtype=F64),
            "bn.bias": torch.zeros(4, dtype=F64), "out.weight": out_w, "out.bias": out_b}
    assert list(gen["params"]) == list(want)
    for k, v in want.items():
        assert gen["params"][k].dtype == F64 and gen["params"][k].shape == v.shape, k
        torch.testing.assert_close(gen["params"][k], v, rtol=0, atol=1e-15, msg=k)
    assert torch.equal(gen["stats"]["mean"], torch.zeros(4, dtype=F64))
    assert torch.equal(gen["stats"]["var"], torch.ones(4, dtype=F64))
    for name, fan_in in (("fc", 5), ("out", 4)):  # within the bound, both signs used
        for v in (gen["params"][f"{name}.weight"], gen["params"][f"{name}.bias"]):
            assert v.abs().max() <= 1 / math.sqrt(fan_in) and v.min() < 0 < v.max()
    other = init_generator(2, 3, 4, 6, seed=8, like=torch.zeros((), dtype=F64))
    assert not torch.equal(other["params"]["fc.weight"], fc_w)  # the seed matters


def test_init_in_float32_is_the_float64_draw_rounded():
    """The draw does not depend on the model's dtype: a float32 run starts from the float64
    weights rounded, in float32 (every tensor, the statistics too)."""
    g32 = init_generator(2, 3, 4, 6, seed=7, like=torch.zeros((), dtype=F32))
    g64 = init_generator(2, 3, 4, 6, seed=7, like=torch.zeros((), dtype=F64))
    for group in ("params", "stats"):
        for k, v in g64[group].items():
            assert g32[group][k].dtype == F32, k
            assert torch.equal(g32[group][k], v.to(F32)), k


def _tiny_generator():
    """noise 1, 2 classes, 2 hidden units, latent 3."""
    return {"fc.weight": torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]], dtype=F64),
            "fc.bias": torch.tensor([0.5, -1.0], dtype=F64),
            "bn.weight": torch.tensor([1.0, 2.0], dtype=F64),
            "bn.bias": torch.tensor([0.0, 0.5], dtype=F64),
            "out.weight": torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]], dtype=F64),
            "out.bias": torch.tensor([0.1, 0.0, -0.2], dtype=F64)}


def test_generate_normalises_by_the_batch_and_updates_running_statistics_unbiased():
    """Two rows: h = W [ε, onehot(y)] + b = [1.5, 2] and [2, −1]; batch mean [1.75, 0.5],
    biased variance [0.0625, 2.25] (normalising), unbiased ×2 (running, momentum 0.1)."""
    params = _tiny_generator()
    stats = {"mean": torch.zeros(2, dtype=F64), "var": torch.ones(2, dtype=F64)}
    eps, labels = torch.tensor([[0.5], [0.25]], dtype=F64), torch.tensor([1, 0])
    z, new = generate(params, stats, labels, eps, True)
    torch.testing.assert_close(new["mean"], torch.tensor([0.175, 0.05], dtype=F64))
    torch.testing.assert_close(new["var"], torch.tensor([0.9 + 0.1 * 0.125, 0.9 + 0.1 * 4.5],
                                                        dtype=F64))
    a, b = 0.25 / math.sqrt(0.0625 + 1e-5), 1.5 / math.sqrt(2.25 + 1e-5)  # |normalised h|
    hidden = torch.tensor([[0.0, 2 * b + 0.5], [a, 0.0]], dtype=F64)  # ReLU([−a, 2b + .5], ..)
    torch.testing.assert_close(z, hidden @ params["out.weight"].T + params["out.bias"])
    assert torch.equal(stats["mean"], torch.zeros(2, dtype=F64))  # the input is not changed


def test_generate_on_a_client_normalises_by_the_running_statistics_which_stay():
    params = _tiny_generator()
    stats = {"mean": torch.tensor([1.0, 0.0], dtype=F64), "var": torch.tensor([3.0, 0.25],
                                                                              dtype=F64)}
    z, new = generate(params, stats, torch.tensor([1]), torch.tensor([[0.5]], dtype=F64), False)
    assert new is stats
    h = [0.5 / math.sqrt(3 + 1e-5), 2 * 2 / math.sqrt(0.25 + 1e-5) + 0.5]  # h = [1.5, 2]
    torch.testing.assert_close(z, torch.tensor([[0.1 + h[0] - h[1], 0.5 * h[0] + 2 * h[1],
                                                 h[1] - 0.2]], dtype=F64))


def test_diversity_loss_by_hand():
    """exp(−mean_ij d_ε(i, j) d_z(i, j)): pairs (0, 1), (0, 2), (1, 2) have d_ε = 0.5, 2, 2.5
    (mean squared difference over 2 values) and d_z = 1, 3, 2 (mean absolute over 1 value);
    each pair counts twice among the 9, the diagonal is 0."""
    eps = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=F64)
    z = torch.tensor([[0.0], [1.0], [3.0]], dtype=F64)
    want = math.exp(-2 * (0.5 * 1 + 2 * 3 + 2.5 * 2) / 9)
    assert diversity_loss(eps, z).item() == pytest.approx(want, rel=1e-14)


def test_adam_starts_at_zero_moments_and_its_first_step_moves_by_the_rate():
    """Zero moments, step count 0 in the weights' dtype; the first step moves each weight by
    lr · g / (|g| + 1e-8) with g the gradient plus weight decay × the weight."""
    params = {"a": torch.tensor([[1.0, -2.0, 0.5]], dtype=F64), "b": torch.tensor([3.0],
                                                                                  dtype=F64)}
    opt = adam_init(params)
    assert list(opt["m"]) == list(opt["v"]) == ["a", "b"]
    for k, p in params.items():
        assert torch.equal(opt["m"][k], torch.zeros_like(p))
        assert torch.equal(opt["v"][k], torch.zeros_like(p))
    assert opt["count"].shape == () and opt["count"].dtype == F64 and opt["count"].item() == 0
    grads = {"a": torch.tensor([[0.2, 0.0, -0.4]], dtype=F64), "b": torch.tensor([-1.0],
                                                                                 dtype=F64)}
    new, opt = adam_step(params, grads, opt, lr=0.01, weight_decay=0.1)
    g = {"a": [0.3, -0.2, -0.35], "b": [-0.7]}  # grad + 0.1 · weight
    for k in params:
        step = [0.01 * x / (abs(x) + 1e-8) for x in g[k]]
        torch.testing.assert_close(new[k].flatten(), params[k].flatten()
                                   - torch.tensor(step, dtype=F64), rtol=0, atol=1e-15)
    assert opt["count"].item() == 1


# --- the server's pieces ----------------------------------------------------------------------

def test_label_weights_split_each_label_by_the_clients_counts():
    """Counts [S = 3 slots, K = 4]: the third slot is empty; label 3 nobody counted (weight 0,
    not NaN); a label qualifies when some client counted it more than once."""
    counts = torch.tensor([[3.0, 1.0, 1.0, 0.0], [1.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
                          dtype=F64)
    w, qualified = label_weights(counts)
    assert w.shape == (4, 3)
    torch.testing.assert_close(w, torch.tensor(
        [[0.75, 0.25, 0.0], [1 / 3, 2 / 3, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=F64))
    assert qualified.tolist() == [0, 1]


def _ce(logits, y):
    return math.log(sum(math.exp(v) for v in logits)) - logits[y]


def test_teacher_loss_weights_each_clients_cross_entropy_by_label():
    """Two clients' heads [2, K = 3, d = 2] on three latents: "batch" multiplies the batch
    means of each client's cross-entropy and of its weights (the code's [B] × [B, 1]
    broadcast), "sample" weights each sample by its own label; a loop over floats."""
    z = torch.tensor([[1.0, 0.0], [0.5, -1.0], [-0.3, 2.0]], dtype=F64)
    y = torch.tensor([0, 2, 2])
    heads_w = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]],
                            [[0.2, -0.4], [0.3, 0.3], [1.0, 1.0]]], dtype=F64)
    heads_b = torch.tensor([[0.0, 0.1, -0.2], [0.3, 0.0, 0.0]], dtype=F64)
    w = torch.tensor([[0.8, 0.2], [0.5, 0.5], [0.1, 0.9]], dtype=F64)  # [K, S]
    for bias in (True, False):
        ce = [[_ce([sum(a * b for a, b in zip(heads_w[s, k].tolist(), z[i].tolist(),
                                               strict=True))
                    + (heads_b[s, k].item() if bias else 0.0) for k in range(3)], y[i])
               for i in range(3)] for s in range(2)]
        wy = [[w[y[i], s].item() for i in range(3)] for s in range(2)]
        batch = sum(sum(ce[s]) / 3 * sum(wy[s]) / 3 for s in range(2))
        sample = sum(sum(c * v for c, v in zip(ce[s], wy[s], strict=True)) / 3 for s in range(2))
        assert abs(batch - sample) > 1e-2  # the two rules differ on these inputs
        b = heads_b if bias else None
        assert teacher_loss(z, y, heads_w, b, w, "batch").item() == pytest.approx(batch,
                                                                                   rel=1e-13)
        assert teacher_loss(z, y, heads_w, b, w, "sample").item() == pytest.approx(sample,
                                                                                    rel=1e-13)


def _uploads(counts, seed=0):
    """The cohort's mean uploads of two clients with bias-free heads (each row one client's)."""
    heads_w = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return {"heads_w": heads_w / 2, "counts": torch.tensor(counts, dtype=F64) / 2}, heads_w


def test_the_server_trains_on_bias_free_heads_with_one_qualified_label():
    """One qualified label is enough to train (every drawn label is it); the uploads are the
    cohort's mean, so each client's row is S × that."""
    part = _part()
    state = part.server_init(_params(bias=False))
    counts = [[1.0, 3.0, 1.0], [1.0, 1.0, 1.0]]  # label 1 only
    mean, heads_w = _uploads(counts)
    new = part.server_update(state, mean, Aggregate({}, {}, 2, 5, 2))
    w, _ = label_weights(torch.tensor(counts, dtype=F64))
    want = train_generator(state, heads_w, None, w, torch.tensor([1]), 2, part.hp)
    for group in ("generator", "stats"):
        for k, v in want[group].items():
            torch.testing.assert_close(new[group][k], v, rtol=1e-12, atol=1e-14)
        assert not all(torch.equal(new[group][k], state[group][k]) for k in state[group])
    assert new["adam"]["count"].item() == HP["generator_steps"]


def test_the_server_keeps_its_generator_when_no_label_qualifies_or_nothing_arrived():
    part = _part()
    state = part.server_init(_params(bias=False))
    mean, _ = _uploads([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    assert part.server_update(state, mean, Aggregate({}, {}, 2, 5, 2)) is state
    assert part.server_update(state, {}, Aggregate({}, {}, 0, 5, 2)) is state


def test_a_float32_server_trains_in_float32():
    """Its noise is drawn in float64 and cast to the heads' dtype, as the generator's weights."""
    part = _part()
    mean, _ = _uploads([[3.0, 1.0, 2.0], [1.0, 2.0, 1.0]])
    out = {}
    for dtype in (F32, F64):
        state = part.server_init(_params(dtype, bias=False))
        out[dtype] = part.server_update(state, {k: v.to(dtype) for k, v in mean.items()},
                                        Aggregate({}, {}, 2, 5, 1))
    assert all(v.dtype == F32 for v in out[F32]["generator"].values())
    for k in ("out.weight", "out.bias"):  # far from Adam's ε (BN cancels fc.bias's gradient)
        torch.testing.assert_close(out[F32]["generator"][k], out[F64]["generator"][k].to(F32),
                                   rtol=1e-4, atol=1e-5)


def test_the_rounds_keys_are_32_bit_draws_of_the_rounds_generator():
    """``randint(0, 2^32)`` per client: the seeded generator reproduces them, and they use the
    32 bits a stream key folds (no aliasing above 2^32, no few keys)."""
    part = _part()
    keys = part.round_info(3, torch.Generator().manual_seed(11))[KEY]
    want = torch.randint(0, 2**32, (3,), generator=torch.Generator().manual_seed(11))
    assert keys.dtype == torch.int64 and torch.equal(keys, want)
    many = part.round_info(4096, torch.Generator().manual_seed(0))[KEY]
    assert 0 <= many.min() and many.max() < 2**32 and many.max() >= 2**31


# --- the clients' pieces ----------------------------------------------------------------------

def _prep(params, y_all, idx, weights):
    return PrepareInputs(params, {}, {}, {}, None, torch.zeros(len(y_all), 2), y_all, idx,
                         weights)


def test_the_cohort_counts_each_clients_labels_and_gives_it_a_slot():
    """Two clients, two steps of two samples (padding weighs 0), three classes of which the
    cohort's batches never hold class 2; the head has no bias."""
    y_all = torch.tensor([0, 1, 1, 0, 1])
    idx = torch.tensor([[[0, 1], [2, 2]], [[3, 4], [1, 0]]])
    weights = torch.tensor([[[1.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]], dtype=F64)
    state, info, metrics = _part().prepare_cohort(_prep(_params(bias=False), y_all, idx,
                                                        weights))
    assert state == {} and metrics == {}  # clients keep nothing
    assert torch.equal(info[COUNTS], torch.tensor([[1.0, 2.0, 0.0], [1.0, 1.0, 0.0]],
                                                  dtype=F64))
    assert info[SLOT].dtype == F64 and torch.equal(info[SLOT], torch.eye(2, dtype=F64))


def _ctx(params, info, round_=2.0, broadcast=None):
    return RoundContext(params, {**(broadcast or {}), "round": torch.tensor(round_, dtype=F64)},
                        {}, info)


def test_a_client_uploads_its_head_and_counts_in_its_slot_in_the_models_dtype():
    """Client 1 of 3: its head in row 1, 1 + its counts in row 1, the rest 0; counts drawn in
    float32 arrive in the float64 model's dtype, as the head does."""
    p = _params()
    info = {SLOT: torch.tensor([0.0, 1.0, 0.0]), COUNTS: torch.tensor([2.0, 0.0, 5.0])}
    state, up = _part().finalize(FinalizeInputs(_ctx(p, info), p, p, {}, None, torch.tensor(2)))
    assert state == {} and sorted(up) == ["counts", "heads_b", "heads_w"]
    assert up["counts"].dtype == F64 and up["heads_w"].dtype == F64
    assert torch.equal(up["counts"], torch.tensor([[0, 0, 0], [3, 1, 6], [0, 0, 0]], dtype=F64))
    assert torch.equal(up["heads_w"][1], p["1.weight"]) and not up["heads_w"][[0, 2]].any()
    assert torch.equal(up["heads_b"][1], p["1.bias"]) and not up["heads_b"][[0, 2]].any()
    assert _part().upload_nbytes(p, {}) == 3 * 8  # the label counts


def test_a_bias_free_head_uploads_no_bias_and_counts_its_classes():
    p = _params(F32, bias=False)
    info = {SLOT: torch.tensor([1.0, 0.0]), COUNTS: torch.tensor([1.0, 2.0, 0.0])}
    _, up = _part().finalize(FinalizeInputs(_ctx(p, info), p, p, {}, None, torch.tensor(1)))
    assert sorted(up) == ["counts", "heads_w"]
    assert _part().upload_nbytes(p, {}) == 3 * 4  # K float32 counts


class Nested(nn.Module):
    """Body 2 -> 2, then the head one module deeper: ``cls.fc``."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.body, self.cls = nn.Linear(2, 2), nn.Sequential()
        self.cls.add_module("fc", head)

    def forward(self, x):
        return self.cls(self.body(x))


class Scaled(nn.Module):
    """A head with one 2-d weight that is not an nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 2))

    def forward(self, h):
        return h @ self.weight.T


def test_a_head_one_module_deeper_is_found_with_its_bias():
    """The head is the module owning the weight (``cls.fc``), not the top-level ``cls``."""
    model = Nested(nn.Linear(2, 3)).double()
    alg = build_algorithm("fedgen", **HP)
    alg.bind_model(model)
    p = {k: v.detach() for k, v in model.named_parameters()}
    info = {SLOT: torch.tensor([1.0]), COUNTS: torch.zeros(3, dtype=F64)}
    _, up = alg.parts[0].finalize(FinalizeInputs(_ctx(p, info), p, p, {}, None, torch.tensor(1)))
    assert torch.equal(up["heads_b"][0], p["cls.fc.bias"])
    with pytest.raises(ValueError, match=r"^fedgen: the model's head 'cls.fc' must be one "
                                         r"nn.Linear layer .*, got Scaled$"):
        build_algorithm("fedgen").bind_model(Nested(Scaled()))


def test_the_configured_head_is_used_and_an_ambiguous_one_is_refused_by_name():
    """``head = ["fc.*"]`` picks fc (3 classes, width 2), not the last layer proj (4, 3)."""
    params = {"fc.weight": torch.zeros(3, 2, dtype=F64), "fc.bias": torch.zeros(3, dtype=F64),
              "proj.weight": torch.zeros(4, 3, dtype=F64)}
    gen = _part(head=["fc.*"]).server_init(params)["generator"]
    assert gen["fc.weight"].shape == (HP["hidden_dim"], HP["noise_dim"] + 3)
    assert gen["out.weight"].shape == (2, HP["hidden_dim"])
    with pytest.raises(ValueError, match=r"^fedgen: the model's head must be one linear layer"):
        _part(head=["fc.*", "proj.*"]).server_init(params)


def _model(dtype):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).to(dtype)
    with torch.no_grad():
        for k, v in _params(dtype).items():
            model.get_parameter(k).copy_(v)
    return model


def _local_loss(dtype, round_=2.0):
    """One local step's loss of client key 12345, step 1: three samples, the last padding."""
    model = _model(dtype)
    alg = build_algorithm("fedgen", **HP)
    alg.bind_model(model)
    part, params = alg.parts[0], _params(dtype)
    state = part.server_init(params)
    x = torch.tensor([[1.0, 0.5], [0.2, -1.0], [-0.7, 0.3]], dtype=dtype)
    y, w = torch.tensor([2, 0, 1]), torch.tensor([1.0, 1.0, 0.0], dtype=dtype)
    info = {KEY: torch.tensor(12345), LOCAL_STEP: torch.tensor(1)}
    ctx = _ctx(params, info, round_, {"fedgen": part.broadcast(state)})
    return part.loss(params, x, y, w, ctx), (model, state, x, y, w)


def test_the_local_loss_matches_a_reference_step():
    """CE on the two real samples + gen_batch_size / B · α_t · CE of the head on latents of
    drawn labels + β_t · the mean KL(target ‖ model) over the real samples, at t = 2."""
    got, (model, state, x, y, w) = _local_loss(F64)
    gen, stats = state["generator"], state["stats"]
    head = model[1]
    logq = F.log_softmax(model(x), 1)
    ce = -(logq[[0, 1], y[:2]]).mean()
    eps = uniform(stream_key(12345, 1, 0), torch.arange(3 * 2), F64).view(3, 2)
    target = F.softmax(head(generate(gen, stats, y, eps, False)[0]), 1)
    kl = (target * (target.log() - logq)).sum(1)[:2].mean()
    drawn = randint(stream_key(12345, 1, 1), torch.arange(3), 3)
    eps = uniform(stream_key(12345, 1, 2), torch.arange(3 * 2), F64).view(3, 2)
    teacher = F.cross_entropy(head(generate(gen, stats, drawn, eps, False)[0]), drawn)
    want = ce + 3 / 3 * (2.0 * 0.9) * teacher + (1.5 * 0.9) * kl
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert _local_loss(F64, 1.0)[0].item() == pytest.approx(ce.item(), rel=1e-12)  # round 1


def test_a_float32_client_draws_its_noise_in_float32():
    got32, got64 = _local_loss(F32)[0], _local_loss(F64)[0]
    assert got32.dtype == F32
    assert got32.item() == pytest.approx(got64.item(), rel=1e-5)


def test_a_loss_without_the_steps_index_is_refused_in_one_line():
    model = _model(F64)
    alg = build_algorithm("fedgen", **HP)
    alg.bind_model(model)
    params = _params()
    ctx = _ctx(params, {KEY: torch.tensor(1)}, 2.0, {"fedgen": alg.parts[0].broadcast(
        alg.parts[0].server_init(params))})
    with pytest.raises(ValueError, match=r"^fedgen: its local loss draws fresh latents at every "
                                         r"step and needs the step's index \(the objective "
                                         r"stage's gradient\)$"):
        alg.parts[0].loss(params, torch.zeros(1, 2, dtype=F64), torch.tensor([0]),
                          torch.ones(1, dtype=F64), ctx)
