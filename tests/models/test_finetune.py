"""model 'pretrained' (fedforge.models.finetune): LoRA adapters as the only trainable leaves,
trained by the engines and algorithms unchanged, through a real `fedforge run`.

Tiny random BERT configurations (with a word-level tokenizer) and a tiny SST-2 folder are
built in the test; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
peft = pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine, classification_loss  # noqa: E402
from fedforge.engine.draw import RoundDraw  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402
from fedforge.errors import ConfigError  # noqa: E402
from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.experiment.runner import read_metrics, run_experiment  # noqa: E402
from fedforge.models import build_model  # noqa: E402

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "movie", "film", "plot", "the", "a"]
T, CLASSES = 8, 2
ADAPTERS = {"r": 2, "lora_alpha": 4, "target_modules": ["query", "value"]}


def tiny_bert_with_tokenizer(folder: Path, dropout: float = 0.0) -> Path:
    """A 2-layer random BERT classifier and a word-level tokenizer ([PAD] = 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                         unk_token="[UNK]").save_pretrained(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cfg = transformers.BertConfig(
            vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32, num_labels=CLASSES,
            hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


def tiny_sst2(root: Path, n: int = 48) -> Path:
    """An SST-2 folder (its format) of sentences whose label is their sentiment word."""
    g = torch.Generator().manual_seed(0)
    for split, rows in (("train", n), ("dev", 16)):
        lines = ["sentence\tlabel"]
        for _ in range(rows):
            label = int(torch.randint(0, 2, (1,), generator=g))
            word = WORDS[int(torch.randint(0, 3, (1,), generator=g)) + 3 * (1 - label)]
            filler = [WORDS[6 + int(i)] for i in torch.randint(0, 5, (3,), generator=g)]
            lines.append(f"{' '.join([*filler[:2], word, filler[2]])} \t{label}")
        (root / "sst2").mkdir(parents=True, exist_ok=True)
        (root / "sst2" / f"{split}.tsv.gz").write_bytes(gzip.compress(
            ("\n".join(lines) + "\n").encode(), mtime=0))
    return root


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tiny_bert_with_tokenizer(tmp_path_factory.mktemp("bert"))


def _tokens(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 4 + len(WORDS), (n, T), generator=g)
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    return torch.where(torch.arange(T) < lengths[:, None], x, 0)


def _round_inputs(clients: int, steps: int, batch: int, seed: int = 0):
    n = clients * steps * batch
    x = _tokens(n, seed)
    y = torch.randint(0, CLASSES, (n,), generator=torch.Generator().manual_seed(seed + 1))
    idx = torch.arange(n).view(clients, steps, batch)
    w = torch.ones(clients, steps, batch)
    w[-1, -1] = 0.0  # the last client is out of data on its last step
    return x, y, idx, w


def _leaves(model) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _nonzero_b(params: dict, seed: int = 3) -> dict:
    """B = 0 at PEFT's init makes LoRA a no-op; a random B makes the rounds test it. The
    head's init (std 0.02) would pass the adapters gradients of 1e-6, below any tolerance: a
    head of scale 2 moves them by 1e-4 to 1e-2 a round."""
    g = torch.Generator().manual_seed(seed)
    scale = {"lora_B": 0.3, "classifier.weight": 2.0}
    return {k: next((s * torch.randn(v.shape, generator=g) for end, s in scale.items()
                     if k.endswith(end)), v) for k, v in params.items()}


def reference_fedavg(folder: Path, start: dict, rounds: int, lr: float, x, y, idx, w,
                     fixed: dict | None = None) -> dict:
    """FedAvg over LoRA written plainly: the transformers model with each adapter added by a
    forward hook, plain autograd SGD per client, deltas averaged by sample counts. ``fixed``:
    adapter factors used as they are and never trained (FFA-LoRA's A)."""
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    scaling = ADAPTERS["lora_alpha"] / ADAPTERS["r"]

    def logits(p: dict, tokens: torch.Tensor) -> torch.Tensor:
        p = {**(fixed or {}), **p}
        hooks = []
        for name, module in hf.named_modules():
            if name.endswith(("query", "value")):
                a, b = p[f"hf.{name}.lora_A"], p[f"hf.{name}.lora_B"]
                hooks.append(module.register_forward_hook(
                    lambda m, inp, out, a=a, b=b: out + scaling * inp[0] @ a.T @ b.T))
        heads = {"classifier.weight": p["hf.classifier.weight"],
                 "classifier.bias": p["hf.classifier.bias"]}
        try:
            return torch.func.functional_call(hf, heads, (tokens,),
                                              {"attention_mask": (tokens != 0).long()}).logits
        finally:
            for h in hooks:
                h.remove()

    params = dict(start)
    sizes = w.sum((1, 2))
    for _ in range(rounds):
        new = {k: torch.zeros_like(v) for k, v in params.items()}
        for c in range(idx.shape[0]):
            p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            for s in range(idx.shape[1]):
                if w[c, s].sum() == 0:
                    continue
                ce = F.cross_entropy(logits(p, x[idx[c, s]]), y[idx[c, s]], reduction="none")
                loss = (ce * w[c, s]).sum() / w[c, s].sum()
                grads = torch.autograd.grad(loss, list(p.values()))
                p = {k: (v - lr * g).detach().requires_grad_(True)
                     for (k, v), g in zip(p.items(), grads, strict=True)}
            for k in new:
                new[k] += sizes[c] / sizes.sum() * p[k].detach()
        params = new
    return params


def engine_run(algorithm, model, engine, start: dict, rounds: int, x, y, idx, w):
    """``rounds`` rounds of ``algorithm`` over every client: (global leaves, client store)."""
    params, state = dict(start), algorithm.server_init(start)
    store = ClientStore(idx.shape[0], algorithm.client_init(params))
    sizes = w.sum((1, 2))
    for t in range(1, rounds + 1):
        draw = RoundDraw(torch.arange(idx.shape[0]), idx, w, sizes / sizes.sum(),
                         round=t).with_keys(0)
        params, state, _ = federated_round(
            RoundSetup(algorithm, engine, classification_loss(model), store, x, y), params,
            state, draw)
    return params, store


def _engine_rounds(model, engine, start: dict, rounds: int, lr: float, x, y, idx, w) -> dict:
    algorithm = build_algorithm("fedavg", local_lr=lr)
    return engine_run(algorithm, model, engine, start, rounds, x, y, idx, w)[0]


def test_two_fedavg_rounds_over_lora_equal_a_hand_rolled_reference(bert):
    torch.manual_seed(0)
    model = build_model("pretrained", (T,), CLASSES, path=str(bert), adapters=ADAPTERS)
    start = _nonzero_b(_leaves(model))
    x, y, idx, w = _round_inputs(clients=3, steps=2, batch=3)
    got = _engine_rounds(model, LoopEngine(), start, 2, 0.5, x, y, idx, w)
    want = reference_fedavg(bert, start, 2, 0.5, x, y, idx, w)
    assert any((got[k] - start[k]).abs().max() > 1e-3 for k in start)
    for k in start:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)
    # a wrong variant (uniform averaging) differs from the engine's rounds
    uniform = reference_fedavg(bert, start, 2, 0.5, x, y, idx, torch.ones_like(w))
    assert max((got[k] - uniform[k]).abs().max() for k in start) > 1e-4


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_loop_and_vmap_engines_agree_over_lora_with_dropout(tmp_path, precision):
    folder = tiny_bert_with_tokenizer(tmp_path / "bert", dropout=0.1)
    torch.manual_seed(0)
    model = build_model("pretrained", (T,), CLASSES, path=str(folder), precision=precision,
                        adapters={**ADAPTERS, "lora_dropout": 0.1})
    start = _nonzero_b(_leaves(model))
    assert all(v.dtype == torch.float32 for v in start.values())  # fp32 master adapters
    x, y, idx, w = _round_inputs(clients=3, steps=2, batch=2)
    loop = _engine_rounds(model, LoopEngine(), start, 1, 0.5, x, y, idx, w)
    vmap = _engine_rounds(model, VmapEngine(chunk_size=3), start, 1, 0.5, x, y, idx, w)
    for k in start:
        torch.testing.assert_close(vmap[k], loop[k], rtol=1e-4, atol=1e-5)


def test_the_base_is_held_once_and_only_adapters_and_head_are_leaves(bert):
    a = build_model("pretrained", (T,), CLASSES, path=str(bert), adapters=ADAPTERS)
    b = build_model("pretrained", (T,), CLASSES, path=str(bert), adapters=ADAPTERS)
    assert a.base is b.base  # one frozen base per process, whatever the cohort
    names = [n for n, _ in a.named_parameters()]
    assert all(n.endswith((".lora_A", ".lora_B")) or n.startswith("hf.classifier.")
               for n in names)
    assert sum(n.endswith(".lora_A") for n in names) == 4  # query, value x 2 layers
    assert list(a.buffers()) == []
    full = build_model("pretrained", (T,), CLASSES, path=str(bert), mode="full")
    assert len(list(full.parameters())) == len(list(full.base.hf.parameters()))


@pytest.mark.parametrize(("options", "field"), [
    ({"adapters": {"rank": 2, "target_modules": ["query"]}}, "adapters.rank"),
    ({"adapters": {"r": 0, "target_modules": ["query"]}}, "adapters.r"),
    ({"adapters": {"r": 2}}, "adapters.target_modules"),
    ({"adapters": {"r": 2, "target_modules": ["nope"]}}, "lora.target_modules"),
    ({"mode": "half"}, "mode"),
    ({"mode": "full", "precision": "bf16"}, "precision"),
    ({"task": "regression"}, "task"),
])
def test_bad_settings_are_refused_in_one_line_naming_the_field(bert, options, field):
    with pytest.raises(ConfigError, match=field) as err:
        build_model("pretrained", (T,), CLASSES, path=str(bert),
                    **{"adapters": ADAPTERS, **options})
    assert "\n" not in str(err.value)


RUN = """
rounds = 2
seed = 0

[data]
dataset = "sst2"
root = "{root}"
partition = "dirichlet"          # label skew
partition_options = {{ alpha = 0.5 }}
num_clients = 4
options = {{ tokenizer = "{folder}", max_len = 8 }}

[model]
name = "pretrained"

[model.options]
path = "{folder}"

[model.options.adapters]
r = 2
lora_alpha = 4
target_modules = ["query", "value"]

[algorithm]
name = "fedavg"
local_lr = 0.5

[client]
batch_size = 4
local_steps = 2

[server]
clients_per_round = 2

[eval]
every = 1

[checkpoint]
every = 1

[engine]
name = "vmap"
"""


def _run_config(folder: Path, root: Path, rounds: int, *extra: str):
    path = root / f"run_{rounds}.toml"
    path.write_text(RUN.format(root=root, folder=folder))
    return load_config(path, [f"rounds={rounds}", *extra])


@pytest.fixture(scope="module")
def sst2_root(tmp_path_factory) -> Path:
    return tiny_sst2(tmp_path_factory.mktemp("data"))


def test_a_lora_run_sends_adapters_only_and_exports_them_for_peft(bert, sst2_root, tmp_path):
    records = run_experiment(_run_config(bert, sst2_root, 2), tmp_path / "run", progress=False)
    model = build_model("pretrained", (T,), CLASSES, path=str(bert), adapters=ADAPTERS)
    leaf_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    last = [r for r in records if "bytes_up_round" in r][-1]
    assert last["bytes_up_round"] == 2 * leaf_bytes  # 2 clients, adapters and head only
    assert last["bytes_down_round"] == 2 * leaf_bytes
    assert "test_accuracy" in read_metrics(tmp_path / "run")[-1]
    cached = list((sst2_root / "sst2" / ".fedforge-cache").glob("sst2-tok*-len8.npz"))
    assert len(cached) == 1  # tokenised once, cached in the data root

    from fedforge.core.checkpoint import load_checkpoint  # noqa: PLC0415

    tensors, _ = load_checkpoint(tmp_path / "run" / "checkpoints", "cpu")
    final = tensors["params"]
    assert set(final) == {n for n, _ in model.named_parameters()}
    base = transformers.AutoModelForSequenceClassification.from_pretrained(bert).eval()
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "run" / "adapters" / "global")
    x = _tokens(5, seed=9)
    model.eval()
    with torch.no_grad():
        want = torch.func.functional_call(model, final, (x,))
        got = loaded(input_ids=x, attention_mask=(x != 0).long()).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_resumed_lora_run_equals_an_uninterrupted_one(bert, sst2_root, tmp_path):
    straight = run_experiment(_run_config(bert, sst2_root, 3), tmp_path / "a", progress=False)
    run_experiment(_run_config(bert, sst2_root, 2), tmp_path / "b", progress=False)
    resumed = run_experiment(_run_config(bert, sst2_root, 3), tmp_path / "b", resume=True,
                             progress=False)
    a = [r["test_accuracy"] for r in straight if "test_accuracy" in r]
    b = [r["test_accuracy"] for r in resumed if "test_accuracy" in r]
    assert a == b and len(a) == 3
    la = [r["train_loss"] for r in straight if "train_loss" in r]
    lb = [r["train_loss"] for r in resumed if "train_loss" in r]
    assert la == lb


def test_personal_adapters_are_exported_per_client(bert, sst2_root, tmp_path):
    run_experiment(_run_config(bert, sst2_root, 1, "algorithm.name=ditto",
                               "eval.per_client=true"), tmp_path / "run", progress=False)
    folders = sorted(p.name for p in (tmp_path / "run" / "adapters").iterdir())
    assert folders == ["client_0", "client_1", "client_2", "client_3", "global"]
    config = json.loads((tmp_path / "run/adapters/client_0/adapter_config.json").read_text())
    assert config["r"] == 2 and sorted(config["target_modules"]) == ["query", "value"]


def test_an_installed_model_is_named_by_its_package_and_a_missing_one_refused():
    from fedforge.models.pretrained import installed_models, resolve_source  # noqa: PLC0415

    with pytest.raises(ConfigError, match="no model in an installed package 'nope-pkg'") as e:
        resolve_source("installed:nope-pkg")
    assert "\n" not in str(e.value)
    for m in installed_models():
        assert resolve_source(f"installed:{m.package}") == m.source


def test_worker_processes_train_lora_as_the_vmap_engine(bert, sst2_root, tmp_path):
    """procs: each worker loads the frozen base once from the folder (the model pickles the
    base as its key) and gives the rounds the vmapped engine gives."""
    runs = [run_experiment(_run_config(bert, sst2_root, 2, f"engine.name={name}"),
                           tmp_path / name, progress=False, allow_processes=True)
            for name in ("vmap", "procs")]
    vmap, procs = ([(r["train_loss"], r["test_accuracy"]) for r in rec if "test_accuracy" in r]
                   for rec in runs)
    assert len(vmap) == 2
    for (la, aa), (lb, ab) in zip(vmap, procs, strict=True):
        assert aa == ab and la == pytest.approx(lb, rel=1e-5)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_a_model_pickled_for_a_worker_keeps_its_mode(tmp_path, monkeypatch, mode):
    """A worker process loads the base afresh (in train mode): the model's own mode must
    reach it, or a worker draws dropout masks the parent does not (the procs engine then
    trained other rounds than the loop)."""
    import cloudpickle  # noqa: PLC0415

    from fedforge.models import finetune  # noqa: PLC0415

    folder = tiny_bert_with_tokenizer(tmp_path / "bert", dropout=0.3)
    torch.manual_seed(0)
    model = build_model("pretrained", (T,), CLASSES, path=str(folder), adapters=ADAPTERS)
    model.train(mode == "train")
    blob = cloudpickle.dumps(model)
    monkeypatch.setattr(finetune, "_BASES", {})  # as in a fresh worker process
    copy = cloudpickle.loads(blob)
    assert copy.base is not model.base
    assert copy.training == copy.base.training == copy.base.hf.training == (mode == "train")
    if mode == "eval":
        x = _tokens(4, seed=2)
        torch.testing.assert_close(copy(x), model(x), rtol=0, atol=0)
