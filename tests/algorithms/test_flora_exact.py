"""FLoRA's pieces on their own, by hand: the fresh A, a client's slot of the stack, the rank
count the bytes rest on, and the one-line refusals.

The three-round reference (test_flora.py) checks the trajectory with heterogeneous ranks; it
never trains at the model's own rank (``ranks`` empty), never aggregates a model without
adapters, and reads the errors only by their field.
"""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedforge.algorithms.flora import (
    RANKS,
    SLOT,
    Stacking,
    check_adapters,
    fresh_a,
    masked_adapters,
    stack,
)
from fedforge.client.transforms import RoundContext
from fedforge.errors import ConfigError
from fedforge.models.lora import LoraLinear
from fedforge.protocol.algorithm import CLIENT_ID, UPLOAD_SCALE, FinalizeInputs
from fedforge.server.chain import Aggregate

F64 = torch.float64


def test_the_fresh_a_is_peft_s_kaiming_uniform_from_the_seed_and_round():
    params = {"l.lora_A": torch.zeros(3, 5, dtype=F64), "l.lora_B": torch.zeros(2, 3)}
    word = int(np.random.SeedSequence([7, 4]).generate_state(1)[0])
    expected = nn.init.kaiming_uniform_(torch.empty(3, 5), a=math.sqrt(5),
                                        generator=torch.Generator().manual_seed(word))
    out = fresh_a(params, 7, 4)
    assert list(out) == ["l.lora_A"] and out["l.lora_A"].dtype == F64
    assert torch.equal(out["l.lora_A"], expected.to(F64))
    assert out["l.lora_A"].abs().max() <= 1 / math.sqrt(5)  # bound sqrt(6 / ((1 + 5) fan_in))


def test_stacking_refuses_weights_that_do_not_match_the_clients():
    a, b = [torch.ones(1, 2), torch.ones(1, 2)], [torch.ones(3, 1), torch.ones(3, 1)]
    with pytest.raises(ValueError):
        stack(a, b, [0.5])


def _fin(a, b, slot, scale, client=0):
    info = {SLOT: slot, UPLOAD_SCALE: torch.tensor(scale), CLIENT_ID: torch.tensor(client)}
    params = {"l.lora_A": a, "l.lora_B": b, "l.weight": torch.zeros(b.shape[0], a.shape[1])}
    ctx = RoundContext(params, {}, {}, info)
    return FinalizeInputs(ctx, params, params, {}, None, torch.tensor(1))


def test_a_client_at_the_model_s_rank_fills_its_slot_and_counts_r_rows():
    """``ranks`` empty: every client trains all r = 2 rows of a [2, 3] A (not 3, its width).
    Its slot (the second of two) holds A; B is divided back by the upload weight 0.25, and the
    rank count is r / 0.25, so the engine's weighted mean gives back r per client."""
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = torch.tensor([[1.0, -1.0]])
    _, up = Stacking(()).finalize(_fin(a, b, torch.tensor([0.0, 1.0]), 0.25))
    assert torch.equal(up["l.lora_A"], torch.cat([torch.zeros(2, 3), a]))
    assert torch.equal(up["l.lora_B"], torch.tensor([[0.0, 0.0, 4.0, -4.0]]))
    assert torch.equal(up[RANKS], torch.tensor([0.0, 8.0]))


def test_a_client_of_rank_one_sends_only_its_first_row_and_column():
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = torch.tensor([[1.0, -1.0]])
    _, up = Stacking((1, 2)).finalize(_fin(a, b, torch.tensor([1.0]), 0.5, client=2))
    assert torch.equal(up["l.lora_A"], torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(up["l.lora_B"], torch.tensor([[2.0, 0.0]]))
    assert torch.equal(up[RANKS], torch.tensor([2.0]))


def test_the_server_counts_the_stack_s_rank_and_zero_without_adapters():
    part = Stacking(())
    state = part.server_init({"w": torch.zeros(2)})
    agg = Aggregate({}, {}, 3, 10, 1)
    state = part.server_update(state, {RANKS: torch.tensor([2.0, 1.0, 1.0 / 3])}, agg)
    assert state["stack_rank"].item() == 10.0  # 3 clients x the mean 10 / 3, rounded
    assert state["cohort"].item() == 3.0 and state["sent_rank"].item() == 0.0
    state = part.server_update(state, {}, agg)  # no adapters: nothing stacked
    assert state["stack_rank"].item() == 0.0 and state["sent_rank"].item() == 10.0


class _Two(nn.Module):
    def __init__(self, alphas: tuple[float, float]) -> None:
        super().__init__()
        self.q = LoraLinear(nn.Linear(3, 2), 2, alphas[0], 0.0)
        self.v = LoraLinear(nn.Linear(3, 2), 2, alphas[1], 0.0)


def test_the_scaling_is_bound_from_the_model_and_must_be_one():
    part = Stacking(())
    assert part.scaling is None
    part.bind_model(_Two((4.0, 4.0)))
    assert part.scaling == 2.0
    part.bind_model(nn.Linear(3, 2))  # no adapters: no scaling
    assert part.scaling is None
    with pytest.raises(ConfigError, match=r"^algorithm.name = 'flora': the adapters' "
                       r"scalings differ \(\[1.0, 2.0\]\); one LoRA config scales them all$"):
        part.bind_model(_Two((2.0, 4.0)))


def test_folding_before_the_model_is_bound_is_refused_in_one_line():
    from fedforge.algorithms import build_algorithm

    algo = build_algorithm("flora")
    params = {"l.lora_A": torch.zeros(2, 3), "l.lora_B": torch.zeros(2, 2),
              "l.weight": torch.zeros(2, 3)}
    state = algo.server_init(params)
    assert algo.server.stages[0].name == "flora"  # the checkpoint's key of this stage
    agg = Aggregate({k: torch.zeros_like(v) for k, v in params.items()}, {}, 1, 1, 1)
    with pytest.raises(ValueError, match=r"^flora: call algorithm.bind_model\(model\) first "
                       r"\(the adapters' scaling\)$"):
        algo.server.stages[0].update(params, agg, state.stages[algo.server.stages[0].name])


@pytest.mark.parametrize("params, message", [
    ({"l.lora_B": torch.zeros(2, 2), "l.weight": torch.zeros(2, 3)},
     "model.options.freeze_a: FLoRA draws a fresh A every round; leave it false"),
    ({"l.lora_A": torch.zeros(2, 3), "l.lora_B": torch.zeros(2, 2)},
     "model.options.fold_adapters: FLoRA folds each round's adapters into the target "
     "weights; set it to true"),
])
def test_a_model_flora_cannot_fold_into_is_refused_with_the_whole_message(params, message):
    with pytest.raises(ConfigError) as err:
        check_adapters(params, ())
    assert str(err.value) == message


@pytest.mark.parametrize("ranks, rows", [((), [1.0, 1.0]), ((1,), [1.0, 0.0])])
def test_no_step_moves_the_target_weight_nor_rows_past_a_client_s_rank(ranks, rows):
    """At the model's rank (``ranks`` empty) both rows of a [2, 3] A train; at rank 1 only
    the first row of A and the first column of B."""
    params = {"l.lora_A": torch.ones(2, 3), "l.lora_B": torch.ones(4, 2),
              "l.weight": torch.ones(4, 3)}
    ctx = RoundContext(params, {}, {}, {CLIENT_ID: torch.tensor(0)})
    t = masked_adapters(Stacking(ranks), "flora_grad")
    out, _ = t.update(params, t.init(params, ctx), params, ctx)
    keep = torch.tensor(rows)
    assert torch.equal(out["l.lora_A"], keep[:, None].expand(2, 3))
    assert torch.equal(out["l.lora_B"], keep.expand(4, 2))
    assert torch.equal(out["l.weight"], torch.zeros(4, 3))
