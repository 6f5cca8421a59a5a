"""FedPTR / FedPTR-S: layer-adaptive prox by hand, λ̃ = 0 ⇒ FedAvg, byte accounting, engine
parity with MTT active, partial-participation windows, and checkpoint/resume."""

import pytest
import torch
from safetensors.torch import load_file

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.fedptr import add_layer_prox
from fedforge.client.transforms import RoundContext
from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict, tree_nbytes
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.config import apply_overrides, validate
from fedforge.experiment.runner import run_experiment
from fedforge.models import build_model
from fedforge.study.labels import without_wall_clock

SMALL = {
    "window": 1,
    "ipc": 1,
    "outer_steps": 2,
    "inner_steps": 2,
    "proj_steps": 2,
    "lr_img": 10.0,
}  # MTT's 1000 suits 100-image sets on a ConvNet, not this toy


def _ctx(params):
    return RoundContext(params, {}, {}, {})


def test_layer_adaptive_prox_gradient_has_norm_lambda_per_layer():
    """Layer ``a`` = a.weight + a.bias, diff (3, 4 | 0), norm 5; layer ``b`` diff ones(2, 2),
    norm 2. With λ = 0.2: a -> 0.2 (3, 4 | 0)/5 = (0.12, 0.16 | 0), b -> 0.2/2 = 0.1 each."""
    params = {
        "a.weight": torch.tensor([3.0, 4.0]),
        "a.bias": torch.tensor([0.0]),
        "b.weight": torch.ones(2, 2),
    }
    anchor = {k: torch.zeros_like(v) for k, v in params.items()}
    lam = torch.tensor(0.2)
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    t = add_layer_prox(lambda ctx: (anchor, lam))
    g, _ = t.update(zeros, {}, params, _ctx(params))
    torch.testing.assert_close(g["a.weight"], torch.tensor([0.12, 0.16]))
    torch.testing.assert_close(g["a.bias"], torch.tensor([0.0]))
    torch.testing.assert_close(g["b.weight"], torch.full((2, 2), 0.1))
    norm_a = torch.cat([g["a.weight"], g["a.bias"]]).norm()
    torch.testing.assert_close(norm_a, lam)
    torch.testing.assert_close(g["b.weight"].norm(), lam)
    # == autograd of Σ_j (λ / ||d_j||)/2 ||d_j||² with the weight λ_j detached
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = 0
    for layer in (["a.weight", "a.bias"], ["b.weight"]):
        sq = sum(((p[k] - anchor[k]) ** 2).sum() for k in layer)
        loss = loss + (lam / sq.sqrt().detach()) / 2 * sq
    loss.backward()
    for k in params:
        torch.testing.assert_close(p[k].grad, g[k])
    fixed, _ = add_layer_prox(lambda ctx: (anchor, lam), adaptive=False).update(
        zeros, {}, params, _ctx(params)
    )
    for k in params:  # the fixed-λ ablation: plain FedProx-style λ (w - w̃)
        torch.testing.assert_close(fixed[k], 0.2 * params[k])


def _image_setup(clients=4, steps=2, batch=3):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3, hidden=(6,))
    n = clients * steps * batch
    x = torch.randn(n, 1, 4, 4)
    y = torch.randint(0, 3, (n,))
    sample_idx = torch.arange(n).view(clients, steps, batch)
    weights = torch.ones(clients, steps, batch)
    weights[1, 1] = 0.0  # client 1's second step is padding
    return model, x, y, sample_idx, weights


def _run(algo, engine, rounds=4, ids_per_round=None):
    model, x, y, sample_idx, weights = _image_setup()
    algo.bind_data((1, 4, 4), 3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = classification_loss(model)
    torch.manual_seed(1)  # FedPTR-S draws its noise D̃ from the global RNG
    server = algo.server_init(params)
    store = ClientStore(4, algo.client_init(params))
    history = [params]
    for r in range(rounds):
        ids = torch.arange(4) if ids_per_round is None else torch.tensor(ids_per_round[r])
        info = algo.round_info(len(ids), torch.Generator().manual_seed(r))
        draw = RoundDraw(ids, sample_idx[ids], weights[ids], info=info, round=r + 1)
        params, server, _ = federated_round(RoundSetup(algo, engine, loss_fn, store, x, y),
                                            params, server, draw)
        history.append(params)
    return params, server, store, history


def _fedavg():
    return build_algorithm("fedavg", local_lr=0.1, client_optimizer="momentum", local_momentum=0.5)


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_lambda_zero_is_fedavg_exactly(name):
    """λ = 0 with MTT and projection running (rounds 3, 4) gives FedAvg's numbers bit for bit."""
    ptr = _run(build_algorithm(name, local_lr=0.1, lam=0.0, **SMALL), LoopEngine())
    avg = _run(_fedavg(), LoopEngine())
    for k in avg[0]:
        assert torch.equal(ptr[0][k], avg[0][k]), k


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_warm_up_is_fedavg_then_prox_acts(name):
    """λ̃ = 0 while t ≤ m (rounds 1-2 for m = 1), λ̃ = λ afterwards."""
    ptr = _run(build_algorithm(name, local_lr=0.1, lam=0.5, **SMALL), LoopEngine(), rounds=3)
    avg = _run(_fedavg(), LoopEngine(), rounds=3)
    for r in (1, 2):
        for k in avg[3][r]:
            assert torch.equal(ptr[3][r][k], avg[3][r][k]), (r, k)
    assert any(not torch.equal(ptr[3][3][k], avg[3][3][k]) for k in avg[3][3])


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_loop_and_vmap_agree_with_mtt_active(name):
    algo = build_algorithm(name, local_lr=0.1, lam=0.5, **SMALL)
    ref = _run(algo, LoopEngine())
    fast = _run(build_algorithm(name, local_lr=0.1, lam=0.5, **SMALL), VmapEngine(chunk_size=3))
    for a, b in ((ref[0], fast[0]), (ref[1], fast[1]), (ref[2].state, fast[2].state)):
        fa, fb = flatten_dict(a), flatten_dict(b)
        assert fa.keys() == fb.keys()
        for k in fa:
            torch.testing.assert_close(fa[k], fb[k], rtol=1e-4, atol=1e-5, msg=k)


def test_fedptr_s_sends_exactly_two_models_down():
    model, *_ = _image_setup()
    params = {k: v.detach() for k, v in model.named_parameters()}
    for name, models_down in (("fedptr_s", 2), ("fedptr", 1)):
        algo = build_algorithm(name)
        algo.bind_data((1, 4, 4), 3)
        down, up = algo.message_nbytes(params, algo.server_init(params))
        assert down == models_down * tree_nbytes(params)
        assert up == tree_nbytes(params)


def test_partial_participation_window_holds_models_the_client_saw():
    """m = 2. Client 0 joins rounds 1 and 3, client 1 rounds 1-3: windows (oldest first)
    are [0, w^0, w^2] (only 2 seen) and [w^0, w^1, w^2]."""
    algo = build_algorithm("fedptr", local_lr=0.1, window=2, ipc=1)
    _, _, store, hist = _run(algo, LoopEngine(), rounds=3, ids_per_round=[[0, 1], [1], [0, 1]])
    st = store.state["fedptr"]
    torch.testing.assert_close(st["seen"][:3], torch.tensor([2.0, 3.0, 0.0]))
    for k in hist[0]:
        assert torch.equal(st["window"][k][0, 0], torch.zeros_like(hist[0][k]))
        assert torch.equal(st["window"][k][0, 1], hist[0][k])
        assert torch.equal(st["window"][k][0, 2], hist[2][k])
        for j in range(3):
            assert torch.equal(st["window"][k][1, j], hist[j][k])


def test_hparam_errors_name_the_field():
    with pytest.raises(ValueError, match="algorithm.window"):
        build_algorithm("fedptr", window=0)
    with pytest.raises(ValueError, match="algorithm.lam"):
        build_algorithm("fedptr_s", lam=-1.0)


BASE = {
    "seed": 3,
    "rounds": 4,
    "data": {
        "dataset": "synthetic",
        "partition": "natural",
        "options": {"num_clients": 6, "alpha": 0.5, "beta": 0.5},
    },
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedptr", "local_lr": 0.05, **SMALL},
    "client": {"batch_size": 8, "local_steps": 2},
    "server": {"clients_per_round": 6},
    "eval": {"every": 1},
    "checkpoint": {"every": 2},
}


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_resume_matches_uninterrupted_run(tmp_path, name):
    def cfg(**over):
        return validate(
            apply_overrides(BASE, [f"{k}={v}" for k, v in {"algorithm.name": name, **over}.items()])
        )

    def strip(h):
        return [without_wall_clock(r) for r in h]

    full = run_experiment(cfg(), tmp_path / "full", progress=False)
    assert full[-1]["prep_s"] > 0  # MTT ran (rounds 3-4) and its time is reported
    run_experiment(cfg(rounds=2), tmp_path / "r", progress=False)
    resumed = run_experiment(cfg(), tmp_path / "r", resume=True, progress=False)
    assert strip(resumed) == strip(full)
    a = load_file(str(tmp_path / "full" / "checkpoints" / "round_00004.safetensors"))
    b = load_file(str(tmp_path / "r" / "checkpoints" / "round_00004.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_mtt_work_is_added_to_the_simulated_clock(tmp_path, name):
    """1 s per local step, (almost) free links. Rounds 3-4 run MTT on n = ipc x 10 classes = 10
    images: 3·H·R·n + K·n = 3·2·2·10 + 2·10 = 140 per-sample gradients = 17.5 steps of batch 8
    each round. FedPTR-S: the server's, serially (+35 s over 2 rounds). FedPTR: every client's,
    in parallel (the round's slowest client), also +17.5 s per round."""
    sim = ["sim.step_time_s=1.0", "sim.bandwidth_up_mbps=1e12", "sim.bandwidth_down_mbps=1e12"]

    def run(algo, out):
        over = [f"algorithm.name={algo}", *sim]
        if algo == "fedavg":  # same local optimizer, no FedPTR hparams
            base = {**BASE, "algorithm": {"name": "fedavg", "local_lr": 0.05}}
        else:
            base = BASE
        return run_experiment(validate(apply_overrides(base, over)), tmp_path / out, progress=False)

    ptr, avg = run(name, "p"), run("fedavg", "a")
    assert avg[-1]["sim_time_s"] == pytest.approx(4 * 2.0, abs=1e-3)  # 2 steps per round
    assert ptr[-1]["sim_time_s"] - avg[-1]["sim_time_s"] == pytest.approx(35.0, abs=1e-3)
