"""FedBN: the normalisation parameters are each client's own, the rest is FedAvg. A float64
NumPy loop (three rounds, partial participation, a padded step) on ``u = c + 2 g + 3 f``
with ``g`` the normalisation leaf; and the zoo's table of normalisation layers held to every
model's GroupNorm/LayerNorm modules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.personal.fedbn import NORM_LAYERS, norm_patterns
from fedforge.algorithms.personal.split import head_names
from fedforge.experiment.config import algorithm_kwargs, load_config
from fedforge.models import MODELS, build_model
from tests.algorithms.personal_rounds import ENGINES, ROWS, quad_grad, quadratic, run_rows, samples

LR = 0.05
P0 = {"conv": np.array([0.4, -0.3]), "gn.weight": np.array([0.1, 0.2]),
      "fc": np.array([-0.2, 0.1])}
SCALE = {"conv": 1.0, "gn.weight": 2.0, "fc": 3.0}
LOSS = quadratic(lambda p: p["conv"] + 2.0 * p["gn.weight"] + 3.0 * p["fc"])
ROOT = Path(__file__).resolve().parents[2]


def reference():
    glob = {k: v.copy() for k, v in P0.items()}
    mine = np.tile(P0["gn.weight"], (3, 1))
    out = []
    for cohort in samples():
        finals = []
        for i, steps in cohort:
            p = {**glob, "gn.weight": mine[i].copy()}
            for rows in steps:
                du = quad_grad(sum(SCALE[k] * p[k] for k in p), ROWS[rows])
                p = {k: p[k] - LR * SCALE[k] * du for k in p}
            mine[i] = p["gn.weight"]
            finals.append(p)
        glob = {k: glob[k] if k == "gn.weight" else np.mean([f[k] for f in finals], axis=0)
                for k in glob}
        out.append(({k: v.copy() for k, v in glob.items()}, mine.copy()))
    return out


def _run(engine=None, norm=("gn.*",)):
    algorithm = build_algorithm("fedbn", local_lr=LR, norm=list(norm))
    return run_rows(algorithm, LOSS, P0, engine)


def test_fedbn_keeps_the_normalisation_leaves_local():
    for (params, state), (glob, mine) in zip(_run(), reference(), strict=True):
        for k in P0:
            np.testing.assert_allclose(params[k], glob[k], rtol=1e-12)
        np.testing.assert_allclose(state["personal/gn.weight"], mine, rtol=1e-12)
    np.testing.assert_array_equal(params["gn.weight"], P0["gn.weight"])  # never averaged


def test_fedbn_loop_equals_vmap():
    for (p, s), (q, t) in zip(_run(ENGINES["loop"]), _run(ENGINES["vmap"]), strict=True):
        for k in p:
            np.testing.assert_allclose(p[k], q[k], rtol=1e-10)
        for k in s:
            np.testing.assert_allclose(s[k], t[k], rtol=1e-10)


def test_fedbn_norm_patterns_that_match_nothing_are_refused():
    with pytest.raises(ValueError, match="algorithm.norm: pattern 'bn.*' matches no"):
        _run(norm=("bn.*",))


def _shape(name):
    if name in ("char_lstm", "text_classifier", "transformer_tiny", "transformer_lm"):
        return (20,)
    return (3, 32, 32) if name not in ("logreg", "mlp") else (20,)


# the pretrained model is built only from a model folder (tests/models/test_finetune.py)
@pytest.mark.parametrize("name", sorted(set(MODELS) - {"pretrained"}))
def test_norm_table_is_every_zoo_models_normalisation_parameters(name):
    model = build_model(name, _shape(name), 10)
    norms = {f"{m}.{p}" if m else p for m, mod in model.named_modules()
             if isinstance(mod, (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d))
             for p, _ in mod.named_parameters(recurse=False)}
    names = [n for n, _ in model.named_parameters()]
    table = set(head_names(names, NORM_LAYERS[name])) if name in NORM_LAYERS else set()
    assert table == norms


def test_a_fedbn_config_takes_the_zoo_models_normalisation_layers():
    cfg = load_config(ROOT / "examples/quickstart.toml",
                      ["algorithm.name=fedbn", "model.name=convnet"])
    assert algorithm_kwargs(cfg)["norm"] == list(NORM_LAYERS["convnet"])
    plain = load_config(ROOT / "examples/quickstart.toml", ["algorithm.name=fedbn"])
    assert "norm" not in algorithm_kwargs(plain)  # logreg has none: FedAvg


def test_norm_patterns_are_the_zoo_models_entry():
    assert norm_patterns("convnet") == ("features.1.*", "features.5.*", "features.9.*")
    assert norm_patterns("resnet18_gn") == NORM_LAYERS["resnet18_gn"]
    assert norm_patterns("mlp") is None
