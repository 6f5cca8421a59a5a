"""Personalised methods under differential privacy, every one in the registry.

Client-level DP (``central``, ``local``) composes with every personalised method: a client
sends only its shared delta, which is clipped (and, locally, noised) like any other; its
own leaves and personal models never leave it, so DP leaves them alone, and leaves no
client sends get no noise. DP-SGD (``sample``) covers a method only where the shared round
starts after no personal pass and takes no gradient besides the step loop's; the others
are refused. Both are checked against what the local round actually does."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.algorithms import ALGORITHMS, build_algorithm  # noqa: E402
from fedforge.core.checkpoint import load_checkpoint  # noqa: E402
from fedforge.engine.local import classification_loss, local_update_of  # noqa: E402
from fedforge.experiment.config import ConfigError, load_config  # noqa: E402
from fedforge.experiment.runner import Experiment, run_experiment  # noqa: E402
from fedforge.models import build_model  # noqa: E402
from fedforge.privacy.accountant import RunEvents  # noqa: E402
from fedforge.privacy.algorithm import KEY, Mechanism, PrivateAlgorithm  # noqa: E402
from fedforge.privacy.checks import check_algorithm  # noqa: E402
from fedforge.privacy.config import PrivacyConfig  # noqa: E402
from fedforge.privacy.mechanisms import noise_like  # noqa: E402
from fedforge.server.chain import Aggregate  # noqa: E402

# FedBN keeps normalisation layers, which an MLP has none of: it keeps the first layer here
OPTIONS = {"fedbn": {"norm": ["net.0.*"]}}
# FedProto sends class prototypes, IFCA and CFL trained models in their cluster's slot,
# uploads no DP mode noises: refused in every mode (below)
NO_DP = {"fedproto", "ifca", "cfl"}
PERSONAL = sorted(n for n in ALGORITHMS if n not in NO_DP
                  and build_algorithm(n, **OPTIONS.get(n, {})).personal is not None)
# refused with DP-SGD: gradients outside the step loop (pFedMe, Per-FedAvg, FedRoD, FedALA's
# weights) or a pass before the shared round (FedRep's head, FedALA's aggregation)
NOT_SAMPLE = {"fedala", "fedrep", "fedrod", "per_fedavg_fo", "per_fedavg_hf", "pfedme"}
SEED_KEY = torch.tensor(12345)
QUICKSTART = Path(__file__).resolve().parents[2] / "examples/quickstart.toml"


def _algorithm(name: str):
    return build_algorithm(name, **OPTIONS.get(name, {}))


def _private(algorithm, mode: str, clip: float, sigma: float) -> PrivateAlgorithm:
    cfg = PrivacyConfig(mode=mode, noise_multiplier=sigma, clip=clip)
    mech = Mechanism(cfg, sigma, 0.5, 10, RunEvents(mode, 0.5, 1), seed=3)
    kwargs = {f.name: getattr(algorithm, f.name) for f in fields(algorithm)}
    return PrivateAlgorithm(**{**kwargs, "privacy": mech})


def _problem():
    """An MLP (body net.0, head net.2), its parameters, and one client's 3 steps of 4."""
    torch.manual_seed(0)
    model = build_model("mlp", (2,), 3, hidden=(4,))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(3, 4, 2, generator=gen)
    ys = torch.randint(0, 3, (3, 4), generator=gen)
    return model, params, xs, ys, torch.ones(3, 4)


def _local_round(algorithm, model, params, xs, ys, ws):
    """One client's local round: (delta, new client state, uploads)."""
    broadcast = {**algorithm.broadcast(algorithm.server_init(params)),
                 "round": torch.tensor(1.0)}
    info = {k: v[0] for k, v in algorithm.round_info(1, torch.Generator()).items()}
    if algorithm.privacy is not None:
        info[KEY] = SEED_KEY
    update = local_update_of(algorithm, classification_loss(model), masked=True)
    out = update(params, broadcast, algorithm.client_init(params), info, xs, ys, ws)
    return out.delta, out.client_state, out.uploads


def _norm(tree) -> torch.Tensor:
    return torch.sqrt(sum((v.double() ** 2).sum() for v in tree.values()))


def test_the_registry_has_the_personalised_methods():
    assert {"ditto", "fedrep", "fedper", "apfl", "local_only"} <= set(PERSONAL)
    assert NOT_SAMPLE <= set(PERSONAL)


@pytest.mark.parametrize("mode", ["central", "local"])
@pytest.mark.parametrize("name", PERSONAL)
def test_client_level_dp_touches_the_shared_delta_only(name, mode):
    model, params, xs, ys, ws = _problem()
    plain = _algorithm(name)
    delta, state, uploads = _local_round(plain, model, params, xs, ys, ws)
    norm = float(_norm(delta))
    clip = norm / 2 if norm > 0 else 1.0  # the clip binds: the delta halves
    private = _private(plain, mode, clip, sigma=0.7)
    check_algorithm(private, params, private.privacy.cfg)  # not refused
    got, got_state, got_uploads = _local_round(private, model, params, xs, ys, ws)
    # the client's personal state (kept leaves, Ditto's v_i, APFL's v_i and α_i, ...)
    torch.testing.assert_close(got_state, state, rtol=0, atol=0)
    assert set(got_uploads) == set(uploads)
    kept = plain.personal.kept_names(params)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    noise = noise_like(params, SEED_KEY, -1)
    for k in params:
        if k in kept:  # never sent: neither clipped nor noised, zero
            assert torch.equal(got[k], torch.zeros_like(params[k])), k
            continue
        want = delta[k] * scale + (0.7 * clip * noise[k] if mode == "local" else 0.0)
        torch.testing.assert_close(got[k], want, rtol=1e-5, atol=1e-6)
    if name in ("fedper", "fedrep", "lg_fedavg", "fedbn", "local_only"):
        assert kept  # these runs did check kept leaves
    if norm > 0:
        assert float(_norm(got if mode == "central" else
                           {k: got[k] - 0.7 * clip * noise[k] for k in got if k not in kept})
                     ) == pytest.approx(clip, rel=1e-5)


@pytest.mark.parametrize("name", PERSONAL)
def test_central_noise_leaves_the_kept_leaves_of_the_global_model(name):
    """The server adds N(0, σ²C²)/(qN) to every leaf a client sends, drawn in leaf order
    from the round's generator, and nothing to the leaves no client sends."""
    _, params, _, _, _ = _problem()
    private = _private(_algorithm(name), "central", 0.5, sigma=0.7)
    delta = {k: torch.full_like(v, 0.01) for k, v in params.items()}
    kept = private.personal.kept_names(params)
    delta = {k: torch.zeros_like(v) if k in kept else v for k, v in delta.items()}
    stage = private.server.stages[0]
    agg = Aggregate(delta, {}, 4, 10, 2)
    _, noisy, _ = stage.update(params, agg, stage.init(params))
    gen = private.privacy._generator(2)
    std = 0.7 * 0.5 / (0.5 * 10)
    for k, v in delta.items():
        draw = torch.randn(v.shape, generator=gen, dtype=v.dtype)
        want = v if k in kept else v + std * draw
        torch.testing.assert_close(noisy.delta[k], want, rtol=0, atol=0)
    new, _ = private.server_step(params, private.server_init(params), agg)
    for k in params:
        assert torch.equal(new[k], params[k]) == (k in kept), k


@pytest.mark.parametrize("name", PERSONAL)
def test_dp_sgd_is_refused_where_it_does_not_cover_the_shared_round(name):
    _, params, _, _, _ = _problem()
    algorithm = _algorithm(name)
    assert algorithm.personal.covered_by_dp_sgd() == (name not in NOT_SAMPLE)
    cfg = PrivacyConfig(mode="sample", noise_multiplier=1.0)
    if name not in NOT_SAMPLE:
        check_algorithm(algorithm, params, cfg)
        return
    with pytest.raises(ValueError) as err:
        check_algorithm(algorithm, params, cfg)
    assert str(err.value).startswith(f"privacy.mode: 'sample' is ill-defined for algorithm "
                                     f"{name!r}: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode", ["central", "local", "sample"])
@pytest.mark.parametrize("name", sorted(NO_DP))
def test_methods_sending_more_than_a_delta_are_refused_in_every_mode(name, mode):
    _, params, _, _, _ = _problem()
    with pytest.raises(ValueError, match=rf"^privacy\.mode: '{mode}' is ill-defined for "
                                         rf"algorithm {name!r}: [^\n]*$"):
        check_algorithm(build_algorithm(name), params, PrivacyConfig(mode=mode,
                                                                     noise_multiplier=1.0))


def _starts_after_a_pass(algorithm, params) -> bool:
    """Whether the shared round's start depends on what a personal pass trained: ``begin``
    with passes that move the parameters by 1 and by 2."""
    from fedforge.client.transforms import RoundContext

    ctx = RoundContext(params, {"round": torch.tensor(1.0)}, algorithm.client_init(params), {})

    def moving(by):
        def train(start, opt, ctx, passes=1):
            moved = {k: v + by for k, v in start.items()}
            return moved, opt.init(start, ctx), None, None, None
        return train

    one = algorithm.personal.begin(moving(1.0), ctx)[0]
    two = algorithm.personal.begin(moving(2.0), ctx)[0]
    return any(not torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("name", PERSONAL)
def test_what_dp_sgd_covers_is_what_the_local_round_does(name):
    """Covered: the shared delta vanishes when DP-SGD clips every example's gradient to
    1e-12 (σ = 0), so no other gradient reaches it, and the round starts after no pass.
    Each refused method fails one of the two."""
    model, params, xs, ys, ws = _problem()
    algorithm = _algorithm(name)
    private = _private(algorithm, "sample", 1e-12, sigma=0.0)
    delta, _, _ = _local_round(private, model, params, xs, ys, ws)
    leaks = float(max(v.abs().max() for v in delta.values())) > 1e-6
    after_pass = _starts_after_a_pass(algorithm, params)
    assert (leaks or after_pass) == (name in NOT_SAMPLE)
    plain, _, _ = _local_round(algorithm, model, params, xs, ys, ws)
    assert name == "local_only" or float(_norm(plain)) > 1e-3  # a plain round does move


BASE = ["data.options.num_clients=12", "server.clients_per_round=4", "client.batch_size=8",
        "model.name=mlp", "privacy.noise_multiplier=1.0"]


@pytest.mark.parametrize("mode", ["central", "local", "sample"])
def test_quickstart_configs_are_refused_in_one_line_where_dp_does_not_cover(mode):
    """Every personalised method loads with client-level DP; with DP-SGD exactly the ones
    it does not cover are refused, naming privacy and the method."""
    for name in PERSONAL:
        over = [*BASE, f"algorithm.name={name}", f"privacy.mode={mode}"]
        if mode != "sample" or name not in NOT_SAMPLE:
            assert load_config(QUICKSTART, over).privacy.mode == mode
            continue
        with pytest.raises(ConfigError, match=rf"^privacy.mode: 'sample' is ill-defined for "
                                              rf"algorithm '{name}': ") as err:
            load_config(QUICKSTART, over)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["ditto", "fedrep"])
def test_a_private_personalised_quickstart_run(name, tmp_path):
    """Two rounds of central DP: the accountant counts them, the personal evaluation runs,
    and FedRep's global head, which no client sends, keeps its initial value exactly."""
    cfg = load_config(QUICKSTART, [*BASE, f"algorithm.name={name}", "privacy.mode=central",
                                   "rounds=2", "eval.every=1", "checkpoint.every=2"])
    exp = Experiment.from_config(cfg)
    before = exp.initial_params()
    run_experiment(cfg, tmp_path / "run", progress=False)
    records = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["round"] == 2 and last["dp_epsilon"] == pytest.approx(
        exp.algorithm.privacy.epsilon(2))
    assert 0.0 <= last["personal_accuracy_mean"] <= 1.0
    params = load_checkpoint(tmp_path / "run/checkpoints")[0]["params"]
    kept = exp.algorithm.personal.kept_names(before)
    assert bool(kept) == (name == "fedrep")
    for k in before:
        assert torch.equal(params[k], before[k]) == (k in kept), k
