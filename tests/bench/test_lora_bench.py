"""fedforge bench lora: the plain PEFT loop computes fedforge's rounds (the same losses and
adapters from the same data and initial adapters, so the comparison is like for like), the
memory bound is its formula, and the command on a tiny random BERT fills every column."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from typer.testing import CliRunner  # noqa: E402

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.bench.lora import (  # noqa: E402
    HEADER,
    memory_bound,
    parse_precisions,
    tiny_bert,
)
from fedforge.bench.lora_run import (  # noqa: E402
    LoraWork,
    fedforge_model,
    make_batches,
    plain_model,
    plain_round,
)
from fedforge.cli import app  # noqa: E402
from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine, classification_loss  # noqa: E402
from fedforge.engine.draw import RoundDraw  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402

CLIENTS, ROUNDS = 3, 2


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> LoraWork:
    folder = tiny_bert(tmp_path_factory.mktemp("bert") / "tiny")
    return LoraWork(path=str(folder), steps=2, batch=4, max_len=8, r=2, alpha=4, lr=0.5)


def _start(work: LoraWork) -> dict:
    """Initial adapters with B and the head scaled up: B = 0 makes LoRA a no-op in the first
    step, and the head's small init (std 0.02) gives near-constant logits, whose losses and
    gradients hardly depend on the adapters."""
    model = fedforge_model(work, "fp32")
    g = torch.Generator().manual_seed(3)
    return {k: (0.3 * torch.randn(v.shape, generator=g) if k.endswith("lora_B") else
                torch.randn(v.shape, generator=g) if k.startswith("hf.classifier")
                else v.detach().clone())
            for k, v in model.named_parameters()}


def _fedforge(work, engine, precision, start, x, y, idx):
    """fedforge's rounds -> (each round's per-client mean step loss, the final adapters)."""
    model = fedforge_model(work, precision)
    algo = build_algorithm("fedavg", local_lr=work.lr)
    params, server = dict(start), algo.server_init(start)
    setup = RoundSetup(algo, engine, classification_loss(model, "fp32"),
                       ClientStore(CLIENTS, algo.client_init(params)), x, y)
    losses = []
    for t in range(1, ROUNDS + 1):
        res = federated_round(setup, params, server, RoundDraw(
            torch.arange(CLIENTS), idx, torch.ones(idx.shape), round=t).with_keys(0))
        params, server = res.params, res.server_state
        losses.append(res.cohort.metrics.loss)
    return torch.stack(losses), params


def _plain(work, precision, start, x, y, idx, pad):
    model, params = plain_model(work, precision, start)
    leaves, losses = dict(start), []
    for _ in range(ROUNDS):
        steps: list[list[float]] = []
        leaves = plain_round(model, params, leaves, x, y, idx, pad, work.lr, steps)
        losses.append(torch.tensor(steps).mean(1))
    return torch.stack(losses), leaves


@pytest.mark.parametrize("engine", [LoopEngine, VmapEngine])
def test_the_plain_peft_loop_computes_fedforges_losses_and_adapters(work, engine):
    x, y, idx, pad = make_batches(work, CLIENTS)
    assert bool((x == pad).any()) and bool((x[:, :2] != pad).all())  # padded, 2+ tokens
    start = _start(work)
    want_loss, want = _fedforge(work, engine(), "fp32", start, x, y, idx)
    got_loss, got = _plain(work, "fp32", start, x, y, idx, pad)
    torch.testing.assert_close(got_loss, want_loss.float(), rtol=1e-5, atol=1e-6)
    assert max(float((want[k] - start[k]).abs().max()) for k in start) > 1e-2  # it trained
    for k in start:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)
    # the check bites: without the padding mask a loop attends to padding, a wrong loop
    nomask, _ = _plain(work, "fp32", start, x, y, idx, pad=-1)
    assert float((nomask - want_loss).abs().max()) > 1e-3


def test_in_bf16_both_hold_the_base_in_bf16_and_agree_to_its_rounding(work):
    x, y, idx, pad = make_batches(work, CLIENTS)
    start = _start(work)
    model, params = plain_model(work, "bf16", start)
    bf16 = {p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    assert bf16 == {torch.bfloat16} and {p.dtype for p in params.values()} == {torch.float32}
    want_loss, want = _fedforge(work, VmapEngine(), "bf16", start, x, y, idx)
    got_loss, got = _plain(work, "bf16", start, x, y, idx, pad)
    torch.testing.assert_close(got_loss, want_loss.float(), rtol=2e-2, atol=2e-2)
    fp32_loss, _ = _fedforge(work, VmapEngine(), "fp32", start, x, y, idx)
    assert float((fp32_loss - want_loss).abs().max()) > 1e-4  # bf16 really ran


def test_the_memory_bound_is_two_bases_and_the_cohorts_adapters_and_activations():
    res = {"base_bytes": 1000, "adapter_bytes": 7, "activation_bytes": 50}
    assert memory_bound(res, 4) == 2 * 1000 + 4 * (10 * 7 + 50)


def test_precisions_are_checked():
    assert parse_precisions("fp32,bf16") == ["fp32", "bf16"]
    for bad in ("", "fp16", "bf16,bf16"):
        with pytest.raises(ValueError, match="--precisions"):
            parse_precisions(bad)


@pytest.mark.parametrize(("args", "field"), [(["--cohorts", "0"], "--cohorts"),
                                             (["--precisions", "fp8"], "--precisions"),
                                             (["--model", "bert-base-uncased"], "--model"),
                                             (["--steps", "0"], "--steps")])
def test_bad_options_are_one_line_errors(tmp_path, args, field):
    res = CliRunner().invoke(app, ["bench", "lora", "--model", "tiny", "--out",
                                   str(tmp_path / "out"), "--results",
                                   str(tmp_path / "results"), *args])
    assert res.exit_code != 0 and field in res.output
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_command_on_a_tiny_bert_fills_every_column(tmp_path):
    results = tmp_path / "results"
    res = CliRunner().invoke(app, ["bench", "lora", "--model", "tiny", "--cohorts", "2",
                                   "--precisions", "fp32,bf16", "--steps", "2", "--groups",
                                   "1", "--warmup", "1", "--iterations", "1", "--out",
                                   str(tmp_path / "out"), "--results", str(results)])
    assert res.exit_code == 0, res.output
    text = (results / "RESULTS.md").read_text()
    assert "| " + " | ".join(HEADER) + " |" in text
    assert "torch " in text and "load average" in text and "command: `" in text
    assert "CPU features: " in text
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| 2 |")]
    assert [(r[1], r[2]) for r in rows] == [("fp32", "fedforge"), ("fp32", "plain"),
                                            ("bf16", "fedforge"), ("bf16", "plain")]
    for row in rows:
        assert len(row) == len(HEADER)
        assert all(row[:-1]) and (row[-1] or row[2] == "plain"), row  # every column filled
        # steps/s = cohort x steps / the row's median timed round, before any rounding
        out = json.loads((tmp_path / "out" / f"{row[2]}-2-{row[1]}.out").read_text())
        round_s = statistics.median(out["iteration_s"])
        printed = 0.5 * 10.0 ** -len(row[5].partition(".")[2])  # what printing may move
        assert float(row[5]) == pytest.approx(2 * 2 / round_s, abs=0.005 + printed)
        assert int(row[7]) >= int(row[8]) > 0 and int(row[9]) > 0
    assert [r[6] for r in rows if r[2] == "plain"] == ["1.00", "1.00"]
    assert all(r[11].startswith("yes (") for r in rows if r[2] == "fedforge"), rows
