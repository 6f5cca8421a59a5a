"""Model-zoo tests: shapes, vmap/grad equivalence with per-client loops, no buffers."""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn import functional as F

from fedforge.engine.randomness import KeyedRandomness
from fedforge.models import LSTM, MODELS, build_model, num_parameters


def _tiny_pretrained() -> str:
    """A tiny random BERT classifier saved once per test session ('' without the extra)."""
    try:
        import transformers  # noqa: PLC0415 (optional extra)
    except ImportError:
        return ""
    folder = Path(tempfile.mkdtemp(prefix="fedforge-tiny-bert-"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=32,
                                      max_position_embeddings=32, num_labels=2)
        transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    return str(folder)


TINY_PRETRAINED = {"path": _tiny_pretrained(),
                   "adapters": {"r": 2, "lora_alpha": 4, "target_modules": ["query", "value"]}}

# name -> (input_shape, num_classes, small kwargs for fast vmap checks, is_token_input, vocab)
CASES: dict[str, tuple[tuple[int, ...], int, dict[str, Any], bool, int]] = {
    "logreg": ((1, 28, 28), 10, {}, False, 0),
    "mlp": ((1, 28, 28), 10, {"hidden": (16, 8)}, False, 0),
    "cnn": ((3, 32, 32), 10, {"channels": (4, 8), "fc": 16}, False, 0),
    "lenet5": ((1, 28, 28), 10, {}, False, 0),
    "simple_cnn": ((3, 16, 16), 10, {"channels": (4, 8), "fc": 16}, False, 0),
    "pfl_simple_cnn": ((3, 8, 8), 10, {}, False, 0),
    "resnet18_gn": ((3, 16, 16), 10, {"width": 8, "groups": 2}, False, 0),
    "convnet": ((3, 32, 32), 10, {"width": 8, "depth": 3}, False, 0),
    "char_lstm": ((12,), 30, {"vocab_size": 30, "hidden": 16}, True, 30),
    "text_classifier": ((10,), 2, {"vocab_size": 50, "embed_dim": 8, "hidden": 8}, True, 50),
    "transformer_tiny": ((10,), 2, {"vocab_size": 50, "d_model": 16, "heads": 4}, True, 50),
    "transformer_lm": ((10,), 30, {"vocab_size": 30, "d_model": 16, "layers": 2}, True, 30),
    "pretrained": ((10,), 2, TINY_PRETRAINED, True, 50),
}
# Defaults of models whose default config is cheap enough to run in the shape test.
DEFAULT_INPUTS: dict[str, tuple[tuple[int, ...], int]] = {
    "logreg": ((1, 28, 28), 10),
    "mlp": ((1, 28, 28), 10),
    "cnn": ((1, 28, 28), 62),
    "lenet5": ((3, 32, 32), 10),
    "simple_cnn": ((3, 32, 32), 10),
    "pfl_simple_cnn": ((3, 32, 32), 10),
    "resnet18_gn": ((3, 32, 32), 10),
    "convnet": ((3, 32, 32), 10),
    "char_lstm": ((80,), 80),
    "text_classifier": ((32,), 2),
    "transformer_tiny": ((32,), 2),
    "transformer_lm": ((80,), 80),
    "pretrained": ((10,), 2),  # with TINY_PRETRAINED: a model needs its folder
}
N_COPIES = 3
BATCH = 2
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def strict_vmap() -> Iterator[None]:
    """Make any vmap fallback a hard error (not only a warning); restore afterwards."""
    fc = torch._C._functorch
    if not hasattr(fc, "_set_vmap_fallback_enabled"):  # private API: degrade to warnings only
        yield
        return
    before = fc._is_vmap_fallback_enabled()
    fc._set_vmap_fallback_enabled(False)
    try:
        yield
    finally:
        fc._set_vmap_fallback_enabled(before)


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """vmap runs convs grouped; TF32 on GPU would make it differ from the loop by >1e-5."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def make_input(
    shape: tuple[int, ...], token: bool, vocab: int, batch: int = BATCH, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if token:
        x = torch.randint(1, vocab, (batch, *shape), generator=g)
        x[0, -3:] = 0  # some trailing padding
        return x
    return torch.randn(batch, *shape, generator=g)


def needs_extra(name: str) -> None:
    if name == "pretrained" and not TINY_PRETRAINED["path"]:
        pytest.skip("model 'pretrained' needs the extra fedforge[pretrained] (transformers)")


def copies(model: nn.Module, n: int = N_COPIES) -> list[nn.Module]:
    """Independent perturbed copies so the vmapped clients really differ."""
    out = []
    for i in range(n):
        m = copy.deepcopy(model)
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))
        out.append(m)
    return out


def test_registry_covered() -> None:
    assert set(CASES) == set(MODELS) == set(DEFAULT_INPUTS)
    for cls, desc in MODELS.values():
        assert issubclass(cls, nn.Module) and desc


def test_unknown_model_raises() -> None:
    with pytest.raises(ValueError, match="nope.*allowed:.*resnet18_gn"):
        build_model("nope", (1, 28, 28), 10)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_output_shape_and_no_buffers(name: str) -> None:
    shape, nc = DEFAULT_INPUTS[name]
    needs_extra(name)
    torch.manual_seed(0)
    model = build_model(name, shape, nc, **(TINY_PRETRAINED if name == "pretrained" else {}))
    assert list(model.buffers()) == []
    token = CASES[name][3]
    vocab = {"char_lstm": 80, "transformer_lm": 80, "pretrained": 50}.get(name, 10000)
    with torch.no_grad():
        out = model(make_input(shape, token, vocab))
    assert out.shape == (BATCH, nc)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deterministic_init(name: str) -> None:
    shape, nc, kw, _, _ = CASES[name]
    needs_extra(name)
    torch.manual_seed(7)
    a = build_model(name, shape, nc, **kw)
    torch.manual_seed(7)
    b = build_model(name, shape, nc, **kw)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.usefixtures("strict_vmap", "no_tf32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_vmap_matches_loop(name: str, device: str) -> None:
    shape, nc, kw, token, vocab = CASES[name]
    needs_extra(name)
    torch.manual_seed(0)
    model = build_model(name, shape, nc, **kw).to(device)
    assert list(model.buffers()) == []
    clients = copies(model)
    params, buffers = stack_module_state(clients)
    assert buffers == {}
    xs = torch.stack([make_input(shape, token, vocab, seed=i) for i in range(N_COPIES)])
    ys = torch.randint(0, nc, (N_COPIES, BATCH), generator=torch.Generator().manual_seed(1))
    xs, ys = xs.to(device), ys.to(device)

    def forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        with KeyedRandomness(torch.tensor(5), 0, "test"):  # dropout: one keyed mask for all
            return functional_call(model, p, (x,))

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(forward(p, x), y)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any vmap fallback warning fails the test
        out = vmap(forward)(params, xs)
        grads = vmap(grad(loss))(params, xs, ys)

    assert out.shape == (N_COPIES, BATCH, nc)
    for i in range(N_COPIES):
        p_i = {k: v[i] for k, v in params.items()}
        torch.testing.assert_close(out[i], forward(p_i, xs[i]), atol=1e-5, rtol=1e-5)
        g_i = grad(loss)(p_i, xs[i], ys[i])
        assert set(g_i) == set(grads)
        for k in g_i:
            torch.testing.assert_close(grads[k][i], g_i[k], atol=1e-5, rtol=1e-5)


def test_known_parameter_counts() -> None:
    assert num_parameters(build_model("mlp", (1, 28, 28), 10)) == 199_210  # FedAvg 2NN
    assert num_parameters(build_model("cnn", (1, 28, 28), 10)) == 1_663_370  # FedAvg CNN
    assert num_parameters(build_model("cnn", (3, 32, 32), 10)) == 2_156_490
    assert num_parameters(build_model("resnet18_gn", (3, 32, 32), 10)) == 11_173_962
    assert num_parameters(build_model("char_lstm", (80,), 80)) == 819_920
    assert num_parameters(build_model("logreg", (1, 28, 28), 10)) == 7_850
    assert num_parameters(build_model("simple_cnn", (3, 32, 32), 10)) == 259_914  # 2 conv, fc 128
    assert num_parameters(build_model("pfl_simple_cnn", (3, 32, 32), 10)) == 1_626_442


def test_image_models_accept_both_sizes() -> None:
    for name in ("cnn", "lenet5", "convnet", "mlp", "logreg"):
        for shape in ((1, 28, 28), (3, 32, 32)):
            kw = {"width": 4} if name == "convnet" else {}
            m = build_model(name, shape, 10, **kw)
            with torch.no_grad():
                assert m(torch.randn(1, *shape)).shape == (1, 10)


def test_lstm_matches_torch_lstm() -> None:
    torch.manual_seed(0)
    ref = nn.LSTM(5, 7, num_layers=2, batch_first=True)
    mine = LSTM(5, 7, num_layers=2)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(3, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x)[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["text_classifier", "transformer_tiny"])
def test_padding_invariance(name: str) -> None:
    shape, nc, kw, _, vocab = CASES[name]
    model = build_model(name, (shape[0] + 4,), nc, **kw)
    x = torch.randint(1, vocab, (2, shape[0]))
    padded = torch.cat([x, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(padded), atol=1e-5, rtol=1e-5)
        assert torch.isfinite(model(torch.zeros(1, 3, dtype=torch.long))).all()


def test_transformer_lm_is_causal() -> None:
    shape, nc, kw, _, vocab = CASES["transformer_lm"]
    model = build_model("transformer_lm", shape, nc, **kw)
    x = torch.randint(1, vocab, (2, shape[0]))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % vocab
    with torch.no_grad():
        a, b = model.forward_all(x), model.forward_all(y)
        torch.testing.assert_close(a[:, :6], b[:, :6])
        assert not torch.allclose(a[:, 6:], b[:, 6:])
        torch.testing.assert_close(model(x), a[:, -1])
