"""Next-token fine-tuning data (fedforge.data.next_token, .hf_text, fedforge.engine.targets):
every position scored, padding never; perplexity per client; the model's tokens cached.

A tiny word-level tokenizer, a tiny random Llama and a bigram stand-in model are built here;
nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.data import cache, load_dataset  # noqa: E402
from fedforge.data import tokenized as tokenized_module  # noqa: E402
from fedforge.data.next_token import IGNORE, next_token_targets  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine, classification_loss  # noqa: E402
from fedforge.engine.client_eval import client_scores, perplexities  # noqa: E402
from fedforge.engine.draw import RoundDraw  # noqa: E402
from fedforge.engine.evaluate import evaluate  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402
from fedforge.errors import ConfigError  # noqa: E402

WORDS = ["to", "be", "or", "not", "that", "is", "the", "question", "my", "lord", "good", "night"]
VOCAB = 2 + len(WORDS)  # [PAD] = 0, [UNK] = 1
TRAIN = {"ROLE_A": ["to be or not", "to be"], "ROLE_B": ["that is the question"],
         "ROLE_C": ["my lord good night my lord good night good night"]}
TEST = {"ROLE_A": ["or not to be"], "ROLE_B": ["the question is that"],
        "ROLE_C": ["good night my lord"]}


def tiny_llama_lm(folder: Path) -> Path:
    """A 1-layer random Llama causal LM and a word-level tokenizer ([PAD] = 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                         unk_token="[UNK]").save_pretrained(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
            pad_token_id=0, bos_token_id=None, eos_token_id=None)
        transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def tiny_shakespeare(root: Path, train: dict | None = None) -> Path:
    """A Shakespeare folder in its format: {role: [snippet, ...]}, gzipped JSON."""
    (root / "shakespeare").mkdir(parents=True, exist_ok=True)
    for split, roles in (("train", train or TRAIN), ("test", TEST)):
        (root / "shakespeare" / f"shakespeare_{split}.json.gz").write_bytes(
            gzip.compress(json.dumps(roles).encode(), mtime=0))
    return root


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return tiny_llama_lm(tmp_path_factory.mktemp("llama"))


def ids_of(words: str) -> list[int]:
    return [2 + WORDS.index(w) for w in words.split()]


class Bigram(nn.Module):
    """logits[b, t] = table[tokens[b, t]]: every token's NLL is hand-computable."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64))

    def forward(self, tokens: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        logits = self.table[tokens]
        return logits if all_positions else logits[:, -1]


def hand_nll(table: torch.Tensor, rows: list[list[int]]) -> list[list[float]]:
    """Each sequence's token NLLs, written out: -log softmax(table[a])[b] for each pair."""
    return [[-float(torch.log_softmax(table[a], -1)[b]) for a, b in zip(r, r[1:])]
            for r in rows]


def padded(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(r)
    lengths = np.array([len(r) for r in rows])
    return x, torch.from_numpy(next_token_targets(x.numpy(), lengths))


ROWS = [ids_of("to be or not to"), ids_of("that is"), ids_of("my lord good")]


def test_perplexity_is_exp_of_the_mean_nll_over_scored_tokens():
    model = Bigram()
    x, y = padded(ROWS, 6)
    nll = hand_nll(model.table.detach(), ROWS)
    flat = [v for r in nll for v in r]
    want = sum(flat) / len(flat)  # 4 + 1 + 2 scored tokens
    got = evaluate(model, dict(model.named_parameters()), x, y, batch_size=2)
    assert got["test_tokens"] == 7
    assert got["test_loss"] == pytest.approx(want, rel=1e-12)
    assert got["test_perplexity"] == pytest.approx(math.exp(want), rel=1e-12)
    # wrong variants differ: per-sequence means averaged, and pads scored as token 0
    per_sequence = sum(sum(r) / len(r) for r in nll) / len(nll)
    pads = hand_nll(model.table.detach(), [r + [0] * (6 - len(r)) for r in ROWS])
    with_pads = sum(v for r in pads for v in r) / sum(map(len, pads))
    assert min(abs(want - per_sequence), abs(want - with_pads)) > 1e-2
    # the training loss is the same mean, and a padded sample (weight 0) adds nothing
    loss = classification_loss(model)
    params = dict(model.named_parameters())
    w = torch.tensor([1.0, 1.0, 1.0])
    assert float(loss(params, x, y, w).detach()) == pytest.approx(want, rel=1e-12)
    xp, yp = torch.cat([x, x[:1]]), torch.cat([y, y[:1]])
    padded_loss = loss(params, xp, yp, torch.tensor([1.0, 1.0, 1.0, 0.0])).detach()
    assert float(padded_loss) == pytest.approx(want, rel=1e-12)
    hits = sum(int(model.table[a].argmax() == b) for r in ROWS for a, b in zip(r, r[1:]))
    assert got["test_accuracy"] == pytest.approx(hits / 7)


def test_each_clients_perplexity_is_over_its_own_tokens_only():
    model = Bigram(seed=1)
    x, y = padded(ROWS, 6)
    nll = hand_nll(model.table.detach(), ROWS)
    own = [torch.tensor([0, 2]), torch.tensor([1])]  # client 0: rows 0 and 2; client 1: row 1
    params = dict(model.named_parameters())
    _, loss, sizes = client_scores(model, params, x, y, own, stacked=False, batch_size=4)
    want0 = (sum(nll[0]) + sum(nll[2])) / 6
    assert loss.tolist() == pytest.approx([want0, nll[1][0]], rel=1e-12)
    assert sizes.tolist() == [2, 1]  # samples: its sequences
    got = {"personal_loss": loss, "global_loss": loss, "sizes": sizes}
    summary = perplexities(got, "")
    ppl = [math.exp(want0), math.exp(nll[1][0])]
    assert got["personal_perplexity"].tolist() == pytest.approx(ppl, rel=1e-12)
    assert summary["personal_perplexity_worst"] == pytest.approx(max(ppl))  # the highest
    assert summary["personal_perplexity_mean"] == pytest.approx(sum(ppl) / 2)
    assert summary["personal_perplexity_weighted"] == pytest.approx((2 * ppl[0] + ppl[1]) / 3)
    assert summary["personal_perplexity_p90"] == pytest.approx(np.percentile(ppl, 90))


def reference_fedavg(start: torch.Tensor, rounds: int, lr: float, rows: list, idx, w,
                     per_sequence: bool = False) -> torch.Tensor:
    """FedAvg written plainly on the bigram table: each step's loss is the mean NLL over the
    scored tokens of the batch's real sequences (``per_sequence``: the wrong variant, each
    sequence's mean averaged); deltas averaged by samples."""
    table, sizes = start.clone(), w.sum((1, 2))
    for _ in range(rounds):
        new = torch.zeros_like(table)
        for c in range(idx.shape[0]):
            p = table.clone().requires_grad_(True)
            for s in range(idx.shape[1]):
                seqs = [[-torch.log_softmax(p[a], -1)[b] for a, b in zip(rows[i], rows[i][1:])]
                        for i, keep in zip(idx[c, s].tolist(), w[c, s].tolist()) if keep]
                if not seqs:
                    continue
                loss = (sum(sum(q) / len(q) for q in seqs) / len(seqs) if per_sequence
                        else sum(sum(q) for q in seqs) / sum(map(len, seqs)))
                (grad,) = torch.autograd.grad(loss, [p])
                p = (p - lr * grad).detach().requires_grad_(True)
            new += sizes[c] / sizes.sum() * p.detach()
        table = new
    return table


@pytest.mark.parametrize("engine", [LoopEngine(), VmapEngine()], ids=["loop", "vmap"])
def test_two_fedavg_rounds_on_token_targets_equal_a_hand_rolled_reference(engine):
    rows = [*ROWS, ids_of("good night"), ids_of("the question is that"), ids_of("or not")]
    x, y = padded(rows, 6)
    idx = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [0, 0]]])  # client 1 pads its last step
    w = torch.tensor([[[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]]], dtype=torch.float64)
    model = Bigram(seed=2)  # float64: the rounds equal the reference to rounding
    start = {"table": model.table.detach().clone()}
    algorithm = build_algorithm("fedavg", local_lr=0.5)
    params, state = dict(start), algorithm.server_init(start)
    store = ClientStore(2, algorithm.client_init(params))
    sizes = w.sum((1, 2))
    for t in (1, 2):
        draw = RoundDraw(torch.arange(2), idx, w, sizes / sizes.sum(), round=t).with_keys(0)
        params, state, _ = federated_round(
            RoundSetup(algorithm, engine, classification_loss(model), store, x, y), params,
            state, draw)
    want = reference_fedavg(start["table"], 2, 0.5, rows, idx, w)
    assert (params["table"] - start["table"]).abs().max() > 1e-2
    torch.testing.assert_close(params["table"], want, rtol=1e-9, atol=1e-10)
    # a wrong variant: each sequence's mean, then the batch's mean, moves the table elsewhere
    one_each = reference_fedavg(start["table"], 2, 0.5, rows, idx, w, per_sequence=True)
    assert (params["table"] - one_each).abs().max() > 1e-4


def test_shakespeare_roles_are_their_own_padded_sequences(llama, tmp_path):
    root = tiny_shakespeare(tmp_path)
    data = load_dataset("shakespeare_lm", root=root, tokenizer=str(llama), max_len=4,
                        max_samples_per_client=None)
    assert data.group_names == sorted(TRAIN) and data.num_classes == VOCAB
    for g, role in enumerate(sorted(TRAIN)):
        rows = data.train_x[torch.from_numpy(data.train_groups == g)]
        labels = data.train_y[torch.from_numpy(data.train_groups == g)]
        real = rows != 0  # this tokenizer has no [PAD] in any text
        assert rows[real].tolist() == ids_of(" ".join(TRAIN[role]))  # its own tokens, in order
        assert not (~real[:-1]).any()  # only its last sequence is padded
        assert (labels[~real] == IGNORE).all() and (labels[:, -1] == IGNORE).all()
        assert labels[:, :-1][real[:, 1:]].tolist() == rows[:, 1:][real[:, 1:]].tolist()
    assert data.test_groups.tolist() == [0, 1, 2]


class Counting:
    """A tokenizer that counts its calls (a cache hit tokenises nothing)."""

    calls = 0

    def __init__(self, tok) -> None:
        self.tok = tok

    def __call__(self, *args, **kwargs):
        Counting.calls += 1
        return self.tok(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.tok)

    def __getattr__(self, name: str):
        return getattr(self.tok, name)


def test_tokens_are_cached_once_and_redone_when_a_file_changes(llama, tmp_path, monkeypatch):
    real = tokenized_module.load_tokenizer
    monkeypatch.setattr(tokenized_module, "load_tokenizer", lambda p: Counting(real(p)))
    root = tiny_shakespeare(tmp_path)

    def load(max_len: int = 4, **options):
        cache._DECODED.clear()  # the process's copy too: only the file may answer
        before = Counting.calls
        data = load_dataset("shakespeare_lm", root=root, tokenizer=str(llama), max_len=max_len,
                            **options)
        return data, Counting.calls - before

    first, calls = load()
    assert calls == 2  # train and test
    assert len(list((root / "shakespeare" / ".fedforge-cache").glob("shakespeare_lm-*"))) == 1
    again, calls = load(max_len=8)  # another length cuts the same cached streams
    assert calls == 0 and again.train_x.shape[1] == 8
    few, calls = load(roles=2)  # the first roles only, from the same entry
    assert calls == 0 and few.group_names == sorted(TRAIN)[:2]
    assert set(few.train_groups) == set(few.test_groups) == {0, 1}
    assert few.train_x.tolist() == first.train_x[torch.from_numpy(first.train_groups < 2)].tolist()
    changed = {**TRAIN, "ROLE_B": ["good night"]}
    tiny_shakespeare(tmp_path, changed)
    after, calls = load()
    assert calls == 2
    assert after.train_x[torch.from_numpy(after.train_groups == 1)][0, :2].tolist() == \
        ids_of("good night")


def _rows(n: int = 12) -> list[dict]:
    g = np.random.default_rng(0)
    return [{"sentence": " ".join(g.choice(WORDS, 3 + i % 5)), "label": i % 2,
             "user": f"u{i % 3}"} for i in range(n)]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    pytest.importorskip("datasets", reason="needs the extra fedforge[huggingface]")
    import datasets  # noqa: PLC0415

    root = tmp_path_factory.mktemp("hf")
    rows = _rows()
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "arrow"))
    return root


@pytest.mark.parametrize("where", ["rows.jsonl", "arrow"])
def test_a_local_text_dataset_is_tokenised_for_classification(llama, hf_folder, where):
    data = load_dataset("huggingface", root=hf_folder, path=str(hf_folder / where),
                        text="sentence", tokenizer=str(llama), max_len=6, test_fraction=0.25)
    assert data.train_x.shape == (9, 6) and data.train_y.dim() == 1 and data.num_classes == 2
    rows = {r["sentence"]: r for r in _rows()}
    first = [s for s in rows if ids_of(s)[:6] == data.train_x[0][data.train_x[0] != 0].tolist()]
    assert first and rows[first[0]]["label"] == int(data.train_y[0])


def test_a_local_text_dataset_without_labels_gives_each_rows_own_sequences(llama, hf_folder):
    data = load_dataset("huggingface", root=hf_folder, path=str(hf_folder / "rows.jsonl"),
                        text="sentence", label="", tokenizer=str(llama), max_len=4,
                        partition_by="user", test_fraction=0.25)
    assert data.train_y.shape == data.train_x.shape  # next-token targets
    assert data.group_names == ["u0", "u1", "u2"]
    texts = {" ".join(WORDS[int(t) - 2] for t in row[row != 0]) for row in data.train_x}
    sentences = [r["sentence"] for r in _rows()]
    assert all(any(t in s for s in sentences) for t in texts)  # a chunk of one row
    from fedforge.data.federated import build_federated_dataset  # noqa: PLC0415

    fed = build_federated_dataset(data, "natural", None, 0)
    for c, idx in enumerate(fed.client_indices):
        assert set(data.train_groups[idx.numpy()].tolist()) == {c}


@pytest.mark.parametrize(("options", "field"), [
    ({"tokenizer": ""}, "data.options.tokenizer: dataset 'shakespeare_lm'"),
    ({"tokenizer": "HuggingFaceTB/SmolLM2-135M"}, "data.options.tokenizer: 'HuggingFaceTB"),
    ({"max_len": 1}, "data.options.max_len"),
])
def test_bad_shakespeare_settings_name_the_field(llama, tmp_path, options, field):
    root = tiny_shakespeare(tmp_path)
    with pytest.raises(ConfigError, match=field) as info:
        load_dataset("shakespeare_lm", root=root, **{"tokenizer": str(llama), **options})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("options", "field"), [
    ({"text": "txt"}, "data.options.text: no column 'txt'"),
    ({"label": "stars"}, "data.options.label: no column 'stars'"),
    ({"path": "missing_folder"}, "data.options.path: '.*missing_folder' is not a local"),
    ({"path": "someone/imdb"}, "data.options.path: 'someone/imdb' is not a local"),
    ({"tokenizer": None}, "data.options.tokenizer: dataset 'huggingface'"),
])
def test_bad_text_settings_name_the_field(llama, hf_folder, options, field, monkeypatch):
    monkeypatch.chdir(hf_folder)
    given = {"path": str(hf_folder / "rows.jsonl"), "text": "sentence",
             "tokenizer": str(llama), **options}
    with pytest.raises((ConfigError, ValueError), match=field) as info:
        load_dataset("huggingface", root=hf_folder, **given)
    assert "\n" not in str(info.value)


RUN = """
rounds = 2
seed = 0

[data]
dataset = "shakespeare_lm"
root = "{root}"
partition = "natural"
options = {{ tokenizer = "{folder}", max_len = 4 }}

[model]
name = "pretrained"

[model.options]
path = "{folder}"
task = "causal_lm"

[model.options.adapters]
r = 2
lora_alpha = 4
target_modules = ["q_proj", "v_proj"]

[algorithm]
name = "{algorithm}"
local_lr = 0.5

[client]
batch_size = 2
local_steps = 2

[server]
clients_per_round = 2

[eval]
every = 1
personal = true
batch_size = 8

[engine]
name = "vmap"
"""


def test_a_run_reports_perplexity_globally_and_per_client(llama, tmp_path):
    from fedforge.experiment.client_metrics import load_client_metrics  # noqa: PLC0415
    from fedforge.experiment.config import load_config  # noqa: PLC0415
    from fedforge.experiment.runner import run_experiment  # noqa: PLC0415

    root = tiny_shakespeare(tmp_path / "data")
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(root=root, folder=llama, algorithm="ditto"))
    last = run_experiment(load_config(path), tmp_path / "run", progress=False)[-1]
    assert last["test_perplexity"] == pytest.approx(math.exp(last["test_loss"]))
    assert last["test_tokens"] == 9  # the test roles' 4 + 4 + 4 tokens, less 1 each
    columns = load_client_metrics(tmp_path / "run")
    for who in ("personal", "global"):
        np.testing.assert_allclose(columns[f"{who}_perplexity"],
                                   np.exp(columns[f"{who}_loss"]))
        final = columns[f"{who}_perplexity"][columns["round"] == 2]
        assert last[f"{who}_perplexity_worst"] == pytest.approx(final.max())
    assert sorted(columns["client"][columns["round"] == 2]) == [0, 1, 2]  # one per role


def test_a_model_scoring_one_position_is_refused_for_token_data(llama, tmp_path):
    from fedforge.experiment.config import load_config  # noqa: PLC0415
    from fedforge.experiment.runner import run_experiment  # noqa: PLC0415

    root = tiny_shakespeare(tmp_path / "data")
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(root=root, folder=llama, algorithm="fedavg"))
    cfg = load_config(path, ["model.options.task=classification"])
    with pytest.raises(ConfigError, match="model.options.task: dataset 'shakespeare_lm' "
                                          "scores every position"):
        run_experiment(cfg, tmp_path / "run", progress=False)


def test_the_progress_line_shows_the_perplexity_and_each_clients():
    import io  # noqa: PLC0415

    from fedforge.experiment.client_metrics import ClientColumns  # noqa: PLC0415
    from fedforge.experiment.metrics import PER_CLIENT  # noqa: PLC0415
    from fedforge.experiment.progress import RoundProgress  # noqa: PLC0415

    record = {"test_accuracy": 0.25, "test_loss": 5.0, "test_perplexity": 148.4,
              "personal_accuracy_mean": 0.2, "personal_accuracy_p10": 0.1,
              "personal_accuracy_worst": 0.0, "personal_perplexity_mean": 150.0,
              "personal_perplexity_p90": 240.0, "personal_perplexity_worst": 270.0,
              PER_CLIENT: ClientColumns({
                  "client": np.arange(2), "held_out": np.zeros(2, bool),
                  "samples": np.ones(2, np.int64), "personal_accuracy": np.array([0.1, 0.3]),
                  "personal_perplexity": np.array([270.0, 30.0])})}
    out = io.StringIO()
    with RoundProgress(1, label="fedavg", stream=out) as bar:
        bar.advance(1, record)
    assert out.getvalue().splitlines()[-1] == (
        "fedavg: round 1/1 accuracy 0.2500 loss 5.0000 perplexity 148.4000 personal mean "
        "150.0000 p90 240.0000 worst 270.0000 clients 0:270.00 1:30.00")


def test_perplexity_metrics_are_declared_lower_is_better_and_at_least_one():
    from fedforge.study.labels import metric  # noqa: PLC0415
    from fedforge.study.sweep import resolve_direction  # noqa: PLC0415

    for key in ("test_perplexity", "personal_perplexity_mean", "global_perplexity_worst",
                "held_out_personal_perplexity_p90", "personal_perplexity"):
        assert metric(key).higher_is_better is False and metric(key).bounds == (1.0, None)
    assert metric("personal_perplexity_worst").clip(0.5) == 1.0
    assert resolve_direction("val_perplexity", None) == "minimize"


def test_fedforge_datasets_lists_shakespeare_by_role_for_next_token_fine_tuning():
    from typer.testing import CliRunner  # noqa: PLC0415

    from fedforge.cli import app  # noqa: PLC0415
    from fedforge.data import DATASETS, dataset_options  # noqa: PLC0415

    assert "next-token" in DATASETS["shakespeare_lm"]
    assert {"tokenizer", "max_len", "roles"} <= set(dataset_options("shakespeare_lm"))
    assert {"text", "tokenizer", "max_len"} <= set(dataset_options("huggingface"))
    res = CliRunner().invoke(app, ["datasets"])
    assert res.exit_code == 0 and "shakespeare_lm" in res.output


@pytest.mark.parametrize(("partition", "options"), [
    ("dirichlet", {"alpha": 0.5}), ("shards", {"classes_per_client": 2}),
    ("flwr:dirichlet", {"alpha": 0.5})])
def test_label_skew_on_next_token_data_is_refused_in_one_line(llama, tmp_path, partition,
                                                                options):
    from fedforge.data.federated import build_federated_dataset  # noqa: PLC0415

    data = load_dataset("shakespeare_lm", root=tiny_shakespeare(tmp_path),
                        tokenizer=str(llama), max_len=4)
    with pytest.raises(ValueError, match=f"data.partition: '{partition}' splits by class "
                                         "labels, and next-token data has none"):
        build_federated_dataset(data, partition, 2, 0, **options)
    assert len(build_federated_dataset(data, "iid", 2, 0).client_indices) == 2
