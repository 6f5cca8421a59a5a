"""The local update's chain of stages: the order is checked where the chain is built, and an
algorithm's chain is the one ``docs/architecture.md`` draws."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.comm.codec import Codec
from fedforge.engine.local import classification_loss, local_update_of, make_local_update
from fedforge.engine.stages import (
    Stage,
    chain,
    codec_stage,
    local_stages,
    objective_stage,
    parts_stage,
    personal_stage,
    privacy_stage,
)
from fedforge.models import build_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


class _Privacy:
    """Stands in for a mechanism: building a chain calls none of its methods."""


def _loss(model_name: str = "mlp", precision: str = "fp32"):
    shape, kw = ((1, 16, 16), {"channels": (4, 8), "fc": 16}) if model_name == "simple_cnn" \
        else ((1, 6, 6), {"hidden": (16,)})
    return classification_loss(build_model(model_name, shape, 5, **kw), precision)


def _documented_order() -> list[str]:
    """The chain drawn in docs/architecture.md, section "The engine"."""
    found = re.search(r"^ *(dropout -> .+ -> codec) *$", DOC.read_text(), re.MULTILINE)
    assert found, "docs/architecture.md draws the local update's chain"
    return found.group(1).split(" -> ")


def test_a_stage_before_one_it_must_follow_is_refused_in_one_line():
    spec = build_algorithm("fedper").personal
    with pytest.raises(ValueError, match=r"^local update stages: 'privacy' must come after "
                                         r"'personal', got privacy -> personal$"):
        chain(privacy_stage(_Privacy(), _loss()), personal_stage(spec))
    fedavg = build_algorithm("fedavg")
    with pytest.raises(ValueError, match="'codec' must come after 'parts'"):
        chain(codec_stage(Codec()), parts_stage(fedavg))
    objective = build_algorithm("moon").objective
    with pytest.raises(ValueError, match="'privacy' must come after 'objective'"):
        chain(privacy_stage(_Privacy(), _loss()), objective_stage(objective))
    with pytest.raises(ValueError, match="duplicate names in parts -> parts"):
        chain(parts_stage(fedavg), parts_stage(fedavg))


def test_a_personal_private_chain_is_in_the_documented_order():
    private = replace(build_algorithm("fedper"), privacy=_Privacy())
    names = local_stages(private, _loss(), masked=False).names
    assert names == ("personal", "privacy", "parts")
    doc = _documented_order()
    assert [n for n in doc if n in names] == list(names)


def test_every_stage_at_once_is_the_documented_chain():
    """A dropout model, padded steps, bf16 weights, a personal method whose step reads its
    batch, its own local loss, privacy and a codec: every stage, in the order the docs draw
    (but ``frozen_bf16``: a zoo model has no frozen layer, and an own loss leaves it out)."""
    apfl = build_algorithm("apfl")
    assert apfl.personal.step_batch
    full = replace(apfl, privacy=_Privacy(), codec=Codec(),
                   objective=build_algorithm("moon").objective)
    names = local_stages(full, _loss("simple_cnn", "bf16_sr"), masked=True).names
    assert list(names) == [n for n in _documented_order() if n != "frozen_bf16"]
    assert local_stages(build_algorithm("fedavg"), _loss(), masked=False).names == ("parts",)
    moon = local_stages(build_algorithm("moon"), _loss(), masked=False).names
    assert moon == ("objective", "parts")  # a non-personal method with its own local loss


def test_a_new_capability_is_a_stage():
    """A stage that sends half the delta: its finish hook, after the parts, halves what the
    plain chain sends and nothing else (the step loop is untouched)."""
    torch.manual_seed(0)
    loss_fn = _loss()
    fedavg = build_algorithm("fedavg", local_lr=0.1)
    params = {k: v.detach().clone() for k, v in loss_fn.model.named_parameters()}
    xs, ys, ws = torch.randn(2, 3, 1, 6, 6), torch.randint(0, 5, (2, 3)), torch.ones(2, 3)
    args = (params, {"round": torch.tensor(1.0)}, {}, {}, xs, ys, ws)
    plain = local_update_of(fedavg, loss_fn, masked=False)(*args)
    half = Stage("half", finish=lambda up, trained, ctx: up._replace(
        delta={k: v / 2 for k, v in up.delta.items()}), after=("parts",))
    stages = chain(*local_stages(fedavg, loss_fn, masked=False).stages, half)
    got = make_local_update(fedavg.local_optimizer, torch.func.grad_and_value(loss_fn),
                            stages)(*args)
    for k in params:
        torch.testing.assert_close(got.delta[k], plain.delta[k] / 2, rtol=0, atol=0)
    torch.testing.assert_close(got.metrics.as_dict(), plain.metrics.as_dict(), rtol=0, atol=0)
