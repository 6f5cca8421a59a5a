"""model.init_from: the saved tensors exactly, from every source; one-line refusals."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from fedforge.models import build_model
from fedforge.models.init_from import InitFromError, init_network, load_init


def _net(hidden=(4,)):
    torch.manual_seed(0)
    return build_model("mlp", (3,), 2, hidden=hidden)


def _saved():
    torch.manual_seed(1)
    return {k: torch.randn_like(v) for k, v in _net().named_parameters()}


def test_loads_exactly_the_saved_tensors(tmp_path):
    saved = _saved()
    path = tmp_path / "w.safetensors"
    save_file(saved, str(path))
    net = _net()
    init_network(net, path)
    for k, p in net.named_parameters():
        assert torch.equal(p.detach(), saved[k]), k


def test_refuses_a_pickled_state_dict_and_says_how_to_convert(tmp_path):
    """fedforge never unpickles: a torch.save'd file is refused in one line."""
    path = tmp_path / "w.pt"
    torch.save(_saved(), path)
    with pytest.raises(InitFromError) as info:
        init_network(_net(), path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "safetensors.torch.save_file" in msg


def test_refuses_a_shape_mismatch_in_one_line_naming_file_and_key(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(_saved(), str(path))
    with pytest.raises(InitFromError) as info:
        load_init(dict(_net(hidden=(5,)).named_parameters()), path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    assert "'net.0.weight' has shape (4, 3), the model expects (5, 3)" in msg


def test_missing_key_extra_key_and_missing_file(tmp_path):
    saved = _saved()
    first = next(iter(saved))
    save_file({k: v for k, v in saved.items() if k != first}, str(tmp_path / "a.safetensors"))
    save_file({**saved, "extra": torch.zeros(1)}, str(tmp_path / "b.safetensors"))
    params = dict(_net().named_parameters())
    with pytest.raises(InitFromError, match=f"missing key '{first}'"):
        load_init(params, tmp_path / "a.safetensors")
    with pytest.raises(InitFromError, match="unexpected key 'extra'"):
        load_init(params, tmp_path / "b.safetensors")
    with pytest.raises(InitFromError, match="no such file"):
        load_init(params, tmp_path / "nope.safetensors")


def test_a_run_folder_gives_its_last_checkpoints_params(tmp_path):
    from fedforge.experiment.config import validate
    from fedforge.experiment.runner import Experiment, run_experiment

    raw = {"seed": 0, "rounds": 2,
           "data": {"dataset": "synthetic", "partition": "natural",
                    "options": {"num_clients": 3}},
           "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "local_lr": 0.1},
           "client": {"batch_size": 8, "local_steps": 2}, "server": {"clients_per_round": 3}}
    run_experiment(validate(raw), tmp_path / "a", progress=False)
    trained = Experiment.load(tmp_path / "a").params()
    fine = Experiment.from_config(validate({**raw, "model": {"name": "logreg",
                                                            "init_from": str(tmp_path / "a")}}))
    start = fine.initial_params()
    assert start.keys() == trained.keys()
    for k in start:
        assert torch.equal(start[k], trained[k]), k


def _splits(n=10):
    from fedforge.data.base import DatasetSplits

    x = torch.arange(n, dtype=torch.float32)[:, None]
    return DatasetSplits("toy", x, torch.arange(n) % 2, x[:3], torch.zeros(3, dtype=torch.long),
                         2, (1,), None, None)


def test_public_and_private_parts_are_disjoint_and_cover_the_training_set():
    from fedforge.data.subsets import select_train

    pub = select_train(_splits(), "public", 0.3).train_x[:, 0].tolist()
    priv = select_train(_splits(), "private", 0.3).train_x[:, 0].tolist()
    assert len(pub) == 3 and len(priv) == 7
    assert sorted(pub + priv) == list(range(10))
    assert pub == select_train(_splits(), "public", 0.3).train_x[:, 0].tolist()  # fixed
    small = select_train(_splits(), "private", 0.3, max_train=4)
    assert small.train_x.shape[0] == 4 and set(small.train_x[:, 0].tolist()) <= set(priv)
    assert small.test_x.shape[0] == 3  # the test split is never touched
    with pytest.raises(ValueError, match="data.options.train_part"):
        select_train(_splits(), "half")


def test_pretrain_writes_weights_that_init_from_loads_and_refuses_to_overwrite(tmp_path):
    from fedforge.experiment.config import validate
    from fedforge.experiment.runner import Experiment
    from fedforge.pretrain import pretrain

    raw = {"seed": 0, "rounds": 1,
           "data": {"dataset": "synthetic", "partition": "natural",
                    "options": {"num_clients": 3, "train_part": "private"}},
           "model": {"name": "logreg"}, "algorithm": {"name": "fedavg"},
           "server": {"clients_per_round": 3}}
    summary = pretrain(validate(raw), tmp_path / "pre", epochs=1, max_steps=3)
    assert summary["steps"] == 3 and summary["data_options"]["train_part"] == "public"
    raw["model"] = {"name": "logreg", "init_from": str(tmp_path / "pre")}
    exp = Experiment.from_config(validate(raw))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "pre" / "model.safetensors"))
    for k, v in exp.initial_params().items():
        assert torch.equal(v, saved[k]), k
    with pytest.raises(FileExistsError, match="model.safetensors"):
        pretrain(validate(raw), tmp_path / "pre")
