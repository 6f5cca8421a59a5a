"""FLoRA over a tiny random BERT (docs/finetuning.md): ``model.options.fold_adapters = true``
makes the target weights leaves that the server folds each round's stacked adapters into,
while the frozen base stays held once, as loaded. Runs through the runner: resume equals an
uninterrupted run bit for bit, the loop and vmap engines agree, and the bytes are each
client's own adapter up and the previous round's stack down. A causal Llama (the paper's
kind of model, grouped KV heads) runs the same rounds in both engines.

The rule itself (the stacked product against FedIT's mean and against uniform weights) is
checked by hand in tests/algorithms/test_flora.py; the registry-wide suite
(tests/conformance/test_registry.py) runs FLoRA on its model without adapters, where it is
FedAvg, so the LoRA-specific conformance is here.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.checkpoint import load_checkpoint  # noqa: E402
from fedforge.core.tree import flatten_dict  # noqa: E402
from fedforge.errors import ConfigError  # noqa: E402
from fedforge.experiment.runner import run_experiment  # noqa: E402
from fedforge.models import build_model  # noqa: E402
from fedforge.study.labels import without_wall_clock  # noqa: E402
from tests.models.test_finetune import (  # noqa: E402
    ADAPTERS,
    CLASSES,
    T,
    _run_config,
    bert,  # noqa: F401 (the module's tiny model folder)
    sst2_root,  # noqa: F401
)

FLORA = ["algorithm.name=flora", "algorithm.ranks=[1, 2]", "algorithm.local_lr=0.5",
         "algorithm.client_optimizer=sgd", "model.options.fold_adapters=true"]
PER_RANK = 4 * (16 + 16) * 4  # query and value of 2 layers: a row of A, a column of B


def _model(folder, **options):
    torch.manual_seed(0)
    return build_model("pretrained", (T,), CLASSES, path=str(folder), adapters=ADAPTERS,
                       **options)


def test_fold_adapters_makes_the_target_weights_leaves_beside_the_shared_base(bert):  # noqa: F811
    plain, folded = _model(bert), _model(bert, fold_adapters=True)
    names = [n for n, _ in folded.named_parameters()]
    targets = [n.removesuffix("lora_A") + "weight" for n in names if n.endswith(".lora_A")]
    assert len(targets) == 4 and set(names) == {n for n, _ in plain.named_parameters()} | set(
        targets)
    assert folded.base is plain.base  # one frozen base in the process
    for n in targets:
        assert torch.equal(folded.get_parameter(n), plain.base.get_parameter(n))
    x = torch.randint(4, 10, (3, T))
    with torch.no_grad():  # a leaf equal to the base's weight: the same network
        torch.testing.assert_close(folded(x), plain(x))
    with pytest.raises(ConfigError, match="model.options.fold_adapters"):
        _model(bert, fold_adapters=True, precision="bf16")
    with pytest.raises(ConfigError, match="model.options.fold_adapters"):
        build_model("pretrained", (T,), CLASSES, path=str(bert), mode="full",
                    fold_adapters=True)


def _tensors(run) -> dict:
    return flatten_dict(load_checkpoint(run / "checkpoints", "cpu")[0])


def test_a_flora_run_resumes_bit_for_bit_and_folds_into_its_own_weights(
        bert, sst2_root, tmp_path):  # noqa: F811
    straight = run_experiment(_run_config(bert, sst2_root, 3, *FLORA), tmp_path / "a",
                              progress=False)
    run_experiment(_run_config(bert, sst2_root, 2, *FLORA), tmp_path / "b", progress=False)
    resumed = run_experiment(_run_config(bert, sst2_root, 3, *FLORA), tmp_path / "b",
                             resume=True, progress=False)
    assert [without_wall_clock(r) for r in straight] == [without_wall_clock(r) for r in resumed]
    a, b = _tensors(tmp_path / "a"), _tensors(tmp_path / "b")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    model = _model(bert, fold_adapters=True)
    weight = "params/hf.bert.encoder.layer.0.attention.self.query.weight"
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(bert)
    original = loaded.get_parameter(weight.removeprefix("params/hf."))
    assert torch.equal(model.base.get_parameter(weight[7:]), original)  # the base as loaded
    assert not torch.equal(a[weight], original)  # the run's own weight took the folds
    assert not (tmp_path / "a" / "adapters").exists()  # folded weights are not an adapter
    head = sum(v.numel() * 4 for k, v in model.named_parameters() if "classifier" in k)
    for last, now in zip(straight, straight[1:]):  # 2 clients a round, ranks 1 or 2 each
        stacked = (now["bytes_down_round"] - 2 * head) // 2  # the last round's stack
        assert stacked // PER_RANK in (2, 3, 4) and stacked % PER_RANK == 0
        assert last["bytes_up_round"] == 2 * (int(stacked / 2) + head)
    assert straight[0]["bytes_down_round"] == 2 * head  # round 1: fresh adapters only


def test_loop_and_vmap_run_the_same_flora_rounds_over_bert(bert, sst2_root, tmp_path):  # noqa: F811
    fast = ["algorithm.local_lr=200.0", "algorithm.max_grad_norm=null"]  # visible folds
    for engine in ("loop", "vmap"):
        run_experiment(_run_config(bert, sst2_root, 2, *FLORA, *fast, f"engine.name={engine}"),
                       tmp_path / engine, progress=False)
    loop, vmap = _tensors(tmp_path / "loop"), _tensors(tmp_path / "vmap")
    start = _model(bert, fold_adapters=True)
    weight = "params/hf.bert.encoder.layer.1.attention.self.value.weight"
    assert (loop[weight] - start.get_parameter(weight[7:])).abs().max() > 1e-3
    for key in loop:
        if key.startswith("params/"):
            torch.testing.assert_close(loop[key], vmap[key], rtol=1e-4, atol=1e-5)


def test_flora_over_a_causal_llama_folds_into_q_and_v_in_both_engines(tmp_path):
    """The paper's kind of model: a causal LM whose v_proj is narrower than q_proj (grouped
    KV heads), so a rank costs another number of bytes in each; no head travels."""
    from fedforge.core.store import ClientStore  # noqa: PLC0415
    from fedforge.engine import LoopEngine, VmapEngine  # noqa: PLC0415
    from fedforge.engine.draw import RoundDraw  # noqa: PLC0415
    from fedforge.engine.local import classification_loss  # noqa: PLC0415
    from fedforge.engine.round import RoundSetup, federated_round  # noqa: PLC0415
    from tests.models.test_pretrained import VOCAB, tiny_llama, tokens  # noqa: PLC0415

    torch.manual_seed(0)
    model = build_model("pretrained", (8,), VOCAB, path=str(tiny_llama(tmp_path)),
                        task="causal_lm", fold_adapters=True,
                        adapters={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    x, idx, w = tokens(18), torch.arange(18).view(3, 2, 3), torch.ones(3, 2, 3)
    y = torch.randint(3, VOCAB, (18,), generator=torch.Generator().manual_seed(1))
    counts = torch.tensor([3, 1, 2])
    finals = []
    for engine in (LoopEngine(), VmapEngine(chunk_size=2)):
        algorithm = build_algorithm("flora", local_lr=0.01, ranks=[1, 2, 4])
        algorithm.bind_model(model)
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        state, store = algorithm.server_init(params), ClientStore(3, {})
        for t in (1, 2):
            draw = RoundDraw(torch.arange(3), idx, w, counts / counts.sum(), counts=counts,
                             info=algorithm.round_info(3, torch.Generator()), round=t)
            params, state, _ = federated_round(RoundSetup(
                algorithm, engine, classification_loss(model), store, x, y), params, state, draw)
        finals.append(params)
    q = next(k for k in finals[0] if k.endswith("q_proj.weight"))
    assert (finals[0][q] - model.get_parameter(q)).abs().max() > 1e-3
    for k in finals[0]:
        torch.testing.assert_close(finals[0][k], finals[1][k], rtol=1e-4, atol=1e-6)
    per_rank = 2 * ((32 + 32) + (32 + 16)) * 4  # 2 layers: q_proj 32 -> 32, v_proj 32 -> 16
    assert algorithm.message_nbytes(finals[1], state) == (7 * per_rank, int(7 / 3 * per_rank))
