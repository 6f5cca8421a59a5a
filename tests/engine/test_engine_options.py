"""Engine options: bf16 autocast must not change what a run learns; host-resident client state."""

from pathlib import Path

import pytest
import torch

from fedforge.engine.local import classification_loss
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.models import build_model

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def test_bf16_autocast_keeps_accuracy(tmp_path):
    final = {}
    for precision in ("fp32", "bf16"):
        cfg = load_config(QUICKSTART, ["rounds=20", "eval.every=20",
                                       f"engine.precision={precision}"])
        final[precision] = run_experiment(cfg, tmp_path / precision, progress=False)[-1]
    assert final["fp32"]["test_accuracy"] > 0.5
    assert abs(final["bf16"]["test_accuracy"] - final["fp32"]["test_accuracy"]) < 0.03
    # and it really ran in bf16: the losses differ in low bits
    assert final["bf16"]["train_loss"] != final["fp32"]["train_loss"]


def test_bf16_loss_is_fp32_and_close():
    torch.manual_seed(0)
    model = build_model("cnn", (1, 28, 28), 10)
    params = dict(model.named_parameters())
    x, y, w = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)), torch.ones(8)
    l32 = classification_loss(model, "fp32")(params, x, y, w)
    l16 = classification_loss(model, "bf16")(params, x, y, w)
    assert l16.dtype == torch.float32
    assert torch.allclose(l16, l32, rtol=2e-2)


def test_unknown_precision_names_the_field():
    with pytest.raises(ValueError, match="engine.precision"):
        classification_loss(torch.nn.Linear(2, 2), "fp8")


def test_host_client_state_store_round_trips():
    from fedforge.core.store import ClientStore

    store = ClientStore(4, {"c": {"w": torch.ones(3)}}, device="cpu", storage="cpu")
    assert store.nbytes_per_client() == 12
    ids = torch.tensor([1, 3])
    got = store.gather(ids)
    assert got["c"]["w"].shape == (2, 3) and torch.equal(got["c"]["w"], torch.ones(2, 3))
    store.scatter(ids, {"c": {"w": torch.full((2, 3), 5.0)}})
    assert store.state["c"]["w"][:, 0].tolist() == [1.0, 5.0, 1.0, 5.0]


def test_host_client_state_run_equals_device_run(tmp_path):
    out = {}
    for where in ("device", "host"):
        cfg = load_config(QUICKSTART, ["rounds=3", "eval.every=3", "algorithm.name=scaffold",
                                       f"engine.client_state={where}"])
        out[where] = run_experiment(cfg, tmp_path / where, progress=False)[-1]
    assert out["host"]["test_accuracy"] == out["device"]["test_accuracy"]
