"""The federated LoRA reproduction: four methods over one model and federation, three
primary claims (FedSA-LoRA against FedIT and FFA-LoRA per client, FLoRA against FedIT)."""

from __future__ import annotations

from pathlib import Path

from fedforge.reproduce import get_reproduction
from fedforge.reproduce.grid import grid_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan():
    spec = get_reproduction("lora")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in grid_plan(spec, ROOT, Path("runs"))}


def test_every_method_runs_the_same_model_and_federation():
    spec, plan = _plan()
    assert spec.seeds == (0, 1, 2) and len(plan) == 12
    for cfg in plan.values():
        assert cfg.model.name == "pretrained" and cfg.model.options["mode"] == "lora"
        assert cfg.model.options["precision"] == "float32"
        assert cfg.model.options["adapters"]["r"] == 8
        assert cfg.data.partition == "dirichlet" and cfg.data.num_clients == 10
        assert cfg.data.partition_options == {"alpha": 0.5}
        assert cfg.server.clients_per_round == 5 and cfg.rounds == 20 and cfg.eval.personal
        assert cfg.algorithm.local_lr == 0.05 and cfg.client.local_steps == 10
    algs = {n: plan[(n, 0)].algorithm.name for n, _ in plan}
    assert algs == {"lora_fedit": "fedavg", "lora_ffa": "fedavg", "lora_fedsa": "fedper",
                    "lora_flora": "flora"}
    assert plan[("lora_ffa", 1)].model.options["freeze_a"] is True
    assert not plan[("lora_fedit", 1)].model.options.get("freeze_a", False)
    assert plan[("lora_fedsa", 2)].model.head == ["*.lora_B"]
    assert plan[("lora_flora", 0)].model.options["fold_adapters"] is True


def test_primary_claims_are_per_client_for_fedsa_and_global_for_flora():
    spec, _ = _plan()
    primary = {(c.a, c.b, c.metric, c.expect) for c in spec.comparisons if c.primary}
    assert primary == {("lora_fedsa", "lora_fedit", "final_personal_acc", ">"),
                       ("lora_fedsa", "lora_ffa", "final_personal_acc", ">"),
                       ("lora_flora", "lora_fedit", "final_acc", ">")}
    assert all(c.kind == "direction" for c in spec.comparisons if c.primary)
    assert all(c.kind == "none" for c in spec.comparisons if not c.primary)
    assert spec.effect(spec.comparisons[0]) == 0.01
