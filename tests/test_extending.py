"""The extension API (docs/extending.md): registering, plugins, sample-weighted part uploads.

FedNova's round and the weighted upload means are checked against numbers worked out by hand
in the comments; the tutorial's code is the code in examples/plugins, run here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedforge
from fedforge.algorithms import ALGORITHMS, Algorithm, FinalizeInputs, Part, build_algorithm
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import add_prox, chain, sgd
from fedforge.core.store import ClientStore
from fedforge.data import PARTITIONERS, DatasetError, load_dataset
from fedforge.data import loaders as dataset_registry
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.config import ConfigError, load_config
from fedforge.models import MODELS
from fedforge.protocol.algorithm import check_support
from fedforge.schedulers.serves import SYNC_MULTITASK_SERVES
from fedforge.server.optimizers import server_sgd
from fedforge.study.compare import comparison_configs

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "examples" / "plugins"
NOVA = str(PLUGINS / "fednova_plugin.py")
CSV = str(PLUGINS / "csv_dataset_plugin.py")
PROX = str(PLUGINS / "prox_plugin.py")


@pytest.fixture(autouse=True)
def registries():
    """Every test leaves the four registries (and the plugin modules) as it found them."""
    saved = [(r, dict(r)) for r in (ALGORITHMS, MODELS, PARTITIONERS,
                                    dataset_registry._REGISTRY)]  # noqa: SLF001
    yield
    for registry, content in saved:
        registry.clear()
        registry.update(content)
    for name in ("fednova_plugin", "csv_dataset_plugin", "tiny_plugin", "broken_plugin",
                 "prox_plugin"):
        sys.modules.pop(name, None)


# --- one FedNova round by hand ------------------------------------------------------------
def quadratic(params, x, y, w):
    """Per-sample loss ½||w − b||² with b = x (so the gradient is w − b)."""
    del y
    per_sample = 0.5 * ((params["w"] - x) ** 2).sum(-1)
    return (per_sample * w).sum() / w.sum().clamp_min(1.0)


def one_round(algorithm, engine, sample_counts=None):
    """Two clients from w = (0, 0), lr 0.5: client 0 (b = (1, 0)) takes one step, client 1
    (b = (0, 2)) two; the second step of client 0 is padding."""
    x_all = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    y_all = torch.zeros(2, dtype=torch.long)
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    state = algorithm.server_init(params)
    store = ClientStore(2, algorithm.client_init(params))
    sample_idx = torch.tensor([[[0], [0]], [[1], [1]]])  # [C, steps, batch]
    weights = torch.tensor([[[1.0], [0.0]], [[1.0], [1.0]]], dtype=torch.float64)
    agg = torch.tensor([0.25, 0.75], dtype=torch.float64)
    draw = RoundDraw(torch.arange(2), sample_idx, weights, agg, counts=sample_counts)
    new, _, cohort = federated_round(RoundSetup(algorithm, engine, quadratic, store, x_all, y_all),
                                     params, state, draw)
    return new["w"], cohort


@pytest.mark.parametrize("engine", [LoopEngine, VmapEngine], ids=["loop", "vmap"])
def test_fednova_round_by_hand(engine):
    """n = (1, 3) samples, so p = (1/4, 3/4); lr 0.5 on ½||w − b||².
    Client 0, one step:  w = 0.5 b = (0.5, 0);            Δ_0 = (−0.5, 0),   τ_0 = 1, d_0 = Δ_0.
    Client 1, two steps: w = (0, 1) then (0, 1.5);        Δ_1 = (0, −1.5),   τ_1 = 2,
                                                          d_1 = (0, −0.75).
    τ_eff = ¼·1 + ¾·2 = 1.75;  Σ p d = (−0.125, −0.5625);  x = 0 − 1.75 Σ p d = (0.21875, 0.984375).
    (FedAvg with the same weights would give x = −Σ p Δ = (0.125, 1.125).)"""
    fedforge.load_plugins([NOVA])
    nova = build_algorithm("my_fednova", local_lr=0.5)
    w, _ = one_round(nova, engine(), sample_counts=torch.tensor([1, 3]))
    assert torch.allclose(w, torch.tensor([0.21875, 0.984375], dtype=torch.float64))
    fedavg = build_algorithm("fedavg", local_lr=0.5)
    w_avg, _ = one_round(fedavg, engine(), sample_counts=torch.tensor([1, 3]))
    assert torch.allclose(w_avg, torch.tensor([0.125, 1.125], dtype=torch.float64))


@pytest.mark.parametrize("engine", [LoopEngine, VmapEngine], ids=["loop", "vmap"])
def test_prox_plugin_round_by_hand(engine):
    """lr 0.5, mu 1, the two clients of :func:`one_round`, p = (1/4, 3/4).
    Client 0, one step (x = x^t, no prox yet): w = (0.5, 0).
    Client 1: w = (0, 1); then g = (w − b) + mu (w − 0) = (0, −1) + (0, 1) = 0, w stays (0, 1).
    Mean: (0.125, 0.75). The wrong order, chain(sgd, add_prox), adds mu (w − x^t) to the step
    -lr·g: client 1 goes (0, 1) + (0, 0.5) + (0, 1) = (0, 2.5), mean (0.125, 1.875)."""
    fedforge.load_plugins([PROX])
    prox = build_algorithm("my_prox", local_lr=0.5, mu=1.0)
    w, _ = one_round(prox, engine(), sample_counts=torch.tensor([1, 3]))
    assert torch.allclose(w, torch.tensor([0.125, 0.75], dtype=torch.float64))
    wrong = Algorithm("wrong_order", chain(sgd(0.5), add_prox(1.0)), server_sgd(1.0),
                      aggregation="num_samples")
    w_wrong, _ = one_round(wrong, engine(), sample_counts=torch.tensor([1, 3]))
    assert torch.allclose(w_wrong, torch.tensor([0.125, 1.875], dtype=torch.float64))


def test_compare_tables_set_a_plugin_hyper_parameter(tmp_path):
    """compare.NAME.algorithm.KEY reaches NAME alone, from the file or the command line;
    algorithm.KEY reaches every method (and FedAvg refuses mu); an unknown NAME is refused."""
    fedforge.load_plugins([PROX])
    cmd = ["compare.my_prox.algorithm.mu=0.1"]
    cfgs = comparison_configs(ROOT / "examples" / "quickstart.toml", ["fedavg", "my_prox"], cmd)
    assert cfgs["my_prox"][0].algorithm.model_extra["mu"] == 0.1
    assert "mu" not in cfgs["fedavg"][0].algorithm.model_extra
    config = tmp_path / "prox.toml"
    config.write_text((ROOT / "examples" / "quickstart.toml").read_text()
                      + "\n[compare.my_prox.algorithm]\nmu = 0.2\n")
    from_file = comparison_configs(config, ["fedavg", "my_prox"])
    assert from_file["my_prox"][0].algorithm.model_extra["mu"] == 0.2
    with pytest.raises(ConfigError, match="algorithm.mu: not a hyper-parameter of 'fedavg'"):
        comparison_configs(config, ["fedavg", "my_prox"], ["algorithm.mu=0.1"])
    with pytest.raises(ConfigError, match="'my_prx' is not among the compared methods"):
        comparison_configs(config, ["fedavg", "my_prox"], ["compare.my_prx.algorithm.mu=1"])


class StepsUpload(Part):
    """Uploads the steps the client took (1 and 2 in :func:`one_round`)."""

    name = "steps"

    def finalize(self, fin: FinalizeInputs):
        return {}, {"tau": fin.num_steps}


class WeightedStepsUpload(StepsUpload):
    name = "weighted_steps"
    upload_weights = "num_samples"


@pytest.mark.parametrize("engine", [LoopEngine, VmapEngine], ids=["loop", "vmap"])
def test_part_uploads_uniform_or_sample_weighted(engine):
    """Uploads 1 and 2: uniform mean (1 + 2)/2 = 1.5; with n = (1, 3) the weighted mean is
    ¼·1 + ¾·2 = 1.75, and with n = (3, 1) it is ¾·1 + ¼·2 = 1.25."""
    algo = Algorithm("probe", local_optimizer("sgd", 0.5), server_sgd(1.0),
                     parts=(StepsUpload(), WeightedStepsUpload()))
    _, cohort = one_round(algo, engine(), sample_counts=torch.tensor([1, 3]))
    assert float(cohort.mean_uploads["steps"]["tau"]) == pytest.approx(1.5)
    assert float(cohort.mean_uploads["weighted_steps"]["tau"]) == pytest.approx(1.75)
    _, cohort = one_round(algo, engine(), sample_counts=torch.tensor([3, 1]))
    assert float(cohort.mean_uploads["weighted_steps"]["tau"]) == pytest.approx(1.25)


def test_skipped_client_leaves_the_others_weights_summing_to_one():
    """Client 2's data is NaN, so ``skip_client`` drops it and re-runs clients 0 and 1 with
    n = (1, 3) of the counts (1, 3, 4): the weighted mean of the steps (1, 2) is again
    ¼·1 + ¾·2 = 1.75 (with the three-client scales kept it would be (⅜·1 + 9⁄8·2)/2)."""
    algo = Algorithm("probe", local_optimizer("sgd", 0.5), server_sgd(1.0),
                     parts=(WeightedStepsUpload(),))
    nan = float("nan")
    x_all = torch.tensor([[1.0, 0.0], [0.0, 2.0], [nan, nan]], dtype=torch.float64)
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    sample_idx = torch.tensor([[[0], [0]], [[1], [1]], [[2], [2]]])
    weights = torch.tensor([[[1.0], [0.0]], [[1.0], [1.0]], [[1.0], [1.0]]],
                           dtype=torch.float64)
    setup = RoundSetup(algo, LoopEngine(), quadratic, ClientStore(3, algo.client_init(params)),
                       x_all, torch.zeros(3, dtype=torch.long), divergence="skip_client")
    draw = RoundDraw(torch.arange(3), sample_idx, weights,
                     torch.full((3,), 1 / 3, dtype=torch.float64), counts=torch.tensor([1, 3, 4]))
    _, _, cohort = federated_round(setup, params, algo.server_init(params), draw)
    assert cohort.metrics.skipped_clients.tolist() == [2]
    assert float(cohort.mean_uploads["weighted_steps"]["tau"]) == pytest.approx(1.75)


def test_weighted_uploads_need_counts_and_a_driver_that_serves_them():
    algo = Algorithm("probe", local_optimizer("sgd", 0.5), server_sgd(1.0),
                     parts=(WeightedStepsUpload(),))
    with pytest.raises(ValueError, match="RoundDraw.counts: .*'probe'"):
        one_round(algo, LoopEngine())
    params = {"w": torch.zeros(2)}
    assert "weighted_uploads" in algo.needs(params)
    with pytest.raises(ValueError, match="sample counts.*multi-task"):
        check_support(algo, params, "tasks[0].algorithm.name", "multi-task driver",
                      SYNC_MULTITASK_SERVES)
    plain = Algorithm("plain", local_optimizer("sgd", 0.5), server_sgd(1.0),
                      parts=(StepsUpload(),))
    assert "weighted_uploads" not in plain.needs(params)


# --- the register_* API -------------------------------------------------------------------
def tiny_factory(local_lr: float = 0.1) -> Algorithm:
    return Algorithm("tiny", local_optimizer("sgd", local_lr), server_sgd(1.0))


def test_register_algorithm_rules():
    fedforge.register_algorithm("tiny", tiny_factory)
    fedforge.register_algorithm("tiny", tiny_factory)  # the same factory again: a no-op
    assert build_algorithm("tiny").name == "tiny"
    with pytest.raises(ValueError, match="'fedavg' is already registered"):
        fedforge.register_algorithm("fedavg", tiny_factory)
    with pytest.raises(ValueError, match="'tiny' is already registered; pass replace=True"):
        fedforge.register_algorithm("tiny", lambda local_lr=0.1: tiny_factory(local_lr))
    with pytest.raises(ValueError, match=r"needs a default \(no default for \['lr'\]\)"):
        fedforge.register_algorithm("nodefault", lambda lr: tiny_factory(lr))
    with pytest.raises(ValueError, match="not a valid name"):
        fedforge.register_algorithm("bad name", tiny_factory)


def test_register_model_and_partitioner_reach_the_config():
    from fedforge.models import LogReg

    def halves(labels, num_clients, rng):
        """Client k gets every num_clients-th sample from k."""
        import numpy as np

        return [np.arange(k, len(labels), num_clients) for k in range(num_clients)]

    fedforge.register_model("my_logreg", LogReg, "a renamed LogReg")
    fedforge.register_partitioner("strided", halves)
    cfg = load_config(ROOT / "examples/quickstart.toml",
                      ["model.name=my_logreg", "data.partition=strided", "data.num_clients=4"])
    assert (cfg.model.name, cfg.data.partition) == ("my_logreg", "strided")
    with pytest.raises(ValueError, match="'natural' is already registered"):
        fedforge.register_partitioner("natural", halves)
    with pytest.raises(ValueError, match="'mnist' is already registered$"):
        fedforge.register_dataset("mnist", halves, "not MNIST")
    with pytest.raises(ValueError, match="'MyData': dataset names are lower case"):
        fedforge.register_dataset("MyData", halves, "upper case")


# --- plugins: Python, config key, command line --------------------------------------------
def test_a_bad_plugin_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_plugin.py").write_text("import fedforge\nraise RuntimeError('boom')\n")
    with pytest.raises(fedforge.plugins.PluginError,
                       match=r"^--plugin: plugin 'broken_plugin' failed to import: "
                             r"RuntimeError: boom$"):
        fedforge.load_plugins(["broken_plugin"])
    config = tmp_path / "c.toml"
    config.write_text('plugins = ["no_such_module"]\n')
    with pytest.raises(ConfigError, match=r"^plugins: plugin 'no_such_module' failed to "
                                          r"import: ModuleNotFoundError"):
        load_config(config, allow_plugins=True)


def test_allowed_plugins_key_is_imported_before_the_config_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # plugin paths are relative to the folder you run from
    cfg = load_config(PLUGINS / "blobs_dirichlet.toml", ["data.root=examples/plugins/data"],
                      allow_plugins=True)
    assert cfg.plugins == ["examples/plugins/csv_dataset_plugin.py"]
    assert cfg.data.dataset == "blobs_csv"


def test_csv_dataset_plugin_with_a_dirichlet_split(tmp_path):
    """The tutorial's CSV dataset: 300/90 rows, 4 features, 3 classes, split over 10 clients."""
    from fedforge.data import build_federated_dataset

    fedforge.load_plugins([CSV])
    splits = load_dataset("blobs_csv", PLUGINS / "data")
    assert (splits.num_train, splits.num_test, splits.num_classes) == (300, 90, 3)
    assert splits.input_shape == (4,)
    assert torch.allclose(splits.train_x.mean(0), torch.zeros(4), atol=1e-5)  # standardised
    fed = build_federated_dataset(splits, "dirichlet", 10, 0, alpha=0.5)
    assert fed.num_clients == 10 and int(fed.client_sizes().sum()) == 300
    with pytest.raises(DatasetError, match=r"blobs_csv/ not found.*train\.csv, test\.csv; "
                                           r"get examples/plugins/data/blobs_csv"):
        load_dataset("blobs_csv", tmp_path)


def _fedforge(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedforge", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300)


def test_cli_runs_a_plugin_algorithm(tmp_path):
    """The tutorial's command: FedNova from the command line, 2 rounds on the quickstart."""
    out = tmp_path / "nova"
    proc = _fedforge("run", "examples/quickstart.toml", "--plugin",
                     "examples/plugins/fednova_plugin.py", "algorithm.name=my_fednova",
                     "rounds=2", "eval.every=1", "--out", str(out), "-q", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    assert rounds == [1, 2]
    resolved = (out / "config.resolved.toml").read_text()
    assert 'name = "my_fednova"' in resolved and "server_lr = 1.0" in resolved
    bad = _fedforge("run", "examples/quickstart.toml", "--plugin", "no_such_plugin",
                    "--out", str(tmp_path / "bad"), cwd=ROOT)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --plugin: plugin 'no_such_plugin' failed to import: ModuleNotFoundError: No "
        "module named 'no_such_plugin'"]


# --- the tutorial is the code that runs -----------------------------------------------------
def test_tutorial_code_is_the_example_code():
    """Every Python block of docs/extending.md is a verbatim excerpt of examples/plugins/."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    sources = "\n".join(p.read_text() for p in PLUGINS.glob("*.py"))
    for block in blocks:
        assert block.strip() in sources, f"not in examples/plugins: {block[:80]!r}"


def test_listing_commands_load_plugins():
    """`fedforge algorithms/datasets --plugin` shows what the plugin registered."""
    algs = _fedforge("algorithms", "--plugin", "examples/plugins/fednova_plugin.py", cwd=ROOT)
    assert algs.returncode == 0, algs.stderr
    assert "my_fednova" in algs.stdout
    data = _fedforge("datasets", "--plugin", "examples/plugins/csv_dataset_plugin.py", cwd=ROOT)
    assert data.returncode == 0, data.stderr
    assert "blobs_csv" in data.stdout


def test_object_api_is_importable_from_the_package():
    from fedforge.experiment import runner

    assert fedforge.Experiment is runner.Experiment
    assert fedforge.run_experiment is runner.run_experiment
    from fedforge.experiment import config

    assert fedforge.load_config is config.load_config and fedforge.RunConfig is config.RunConfig
