"""The personalised-FL evaluation protocol: every client on its own held-out data.

Each evaluation reports, over the evaluated clients, the mean accuracy, the sample-weighted
mean, the 10th percentile and the worst client, for the clients' personal models
(``personal_accuracy_*``) and, on the same data, for the global model
(``global_accuracy_*``). The held-out clients (``eval.held_out``), which never train, are
reported apart (``held_out_personal_accuracy_*``) after ``eval.finetune_steps`` fine-tuning
steps on their own training samples. Everything is batched over clients (``vmap`` of
``functional_call`` over stacked parameters), and every function here takes the client ids to
evaluate, so a caller may evaluate a sample of clients.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedforge.algorithms.base import Algorithm
from fedforge.core.tree import Params, tree_map
from fedforge.data.batching import client_batches
from fedforge.data.client_split import ClientTests, client_split
from fedforge.data.federated import gather_round_indices
from fedforge.engine.local import LossFn, local_update_of


def _padded(indices: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max([len(i) for i in indices] + [1])
    idx = torch.zeros(len(indices), width, dtype=torch.int64, device=device)
    mask = torch.zeros(len(indices), width, dtype=torch.bool, device=device)
    for row, i in enumerate(indices):
        idx[row, : len(i)] = i.to(device)
        mask[row, : len(i)] = True
    return idx, mask


@torch.no_grad()
def client_accuracy(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                    indices: Sequence[torch.Tensor], stacked: bool = True,
                    batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (accuracy [C], test samples [C]) of client c's parameters on ``x[indices[c]]``.

    ``params`` is stacked ``[C, ...]`` (each client its own model) or, with
    ``stacked=False``, one model for every client. Clients go through in chunks of about
    ``batch_size`` samples, each chunk one vmapped forward pass in eval mode."""
    num = len(indices)
    correct = torch.zeros(num, dtype=torch.float64)
    sizes = torch.tensor([len(i) for i in indices], dtype=torch.float64)
    width = max(int(sizes.max()) if num else 1, 1)
    chunk = max(1, batch_size // width)

    def forward(p, xb):
        return torch.func.functional_call(model, p, (xb,))

    training = model.training
    model.eval()
    try:
        for lo in range(0, num, chunk):
            hi = min(num, lo + chunk)
            idx, mask = _padded(indices[lo:hi], x.device)
            p = tree_map(lambda t, lo=lo, hi=hi: t[lo:hi], params) if stacked else params
            logits = torch.func.vmap(forward, in_dims=(0 if stacked else None, 0))(p, x[idx])
            hit = (logits.argmax(-1) == y[idx]) & mask
            correct[lo:hi] = hit.sum(1).double().cpu()
    finally:
        model.train(training)
    return correct / sizes.clamp_min(1), sizes


def summarise(prefix: str, accuracy: torch.Tensor, sizes: torch.Tensor) -> dict[str, float]:
    """``{prefix}_mean``, ``_weighted`` (by test samples), ``_p10`` and ``_worst`` over the
    clients with test data."""
    has = sizes > 0
    if not bool(has.any()):
        return {}
    acc, n = accuracy[has].double(), sizes[has].double()
    return {f"{prefix}_mean": float(acc.mean()),
            f"{prefix}_weighted": float((acc * n).sum() / n.sum()),
            f"{prefix}_p10": float(np.percentile(acc.numpy(), 10)),
            f"{prefix}_worst": float(acc.min())}


def finetune(algorithm: Algorithm, loss_fn: LossFn, start: Params, client_ids: torch.Tensor,
             tests: ClientTests, train_x: torch.Tensor, train_y: torch.Tensor, steps: int,
             batch_size: int, generator: torch.Generator, round_: int) -> Params:
    """Each client's ``start`` model (stacked ``[C, ...]``) after ``steps`` local steps of
    ``algorithm``'s local round on its own training samples, all clients in one vmap."""
    if steps <= 0:
        return start
    sizes = tests.train_sizes[client_ids.cpu()]
    pos, weights = client_batches(sizes, steps, None, batch_size, generator)
    idx = gather_round_indices(tests.train_table, client_ids, pos)
    dev = train_x.device
    weights = weights.to(dev, next(iter(start.values())).dtype)
    update = local_update_of(algorithm, loss_fn, masked=True, engine="vmap")
    broadcast = {"round": torch.tensor(float(round_), device=dev)}
    out = torch.func.vmap(update, in_dims=(0, None, None, None, 0, 0, 0))(
        start, broadcast, {}, {}, train_x[idx], train_y[idx], weights)
    return {k: start[k] - out.delta[k] for k in start}


def stack(params: Params, num: int) -> Params:
    return {k: v.unsqueeze(0).expand(num, *v.shape).clone() for k, v in params.items()}


def personal_models(algorithm: Algorithm, global_params: Params, states: dict, num: int
                    ) -> Params:
    """The clients' personal models, stacked (their states stacked ``[C, ...]``); the global
    model for an algorithm without a personal part."""
    personal = algorithm.personal
    if personal is None:
        return stack(global_params, num)
    return torch.func.vmap(personal.client_params, in_dims=(None, 0))(global_params, states) \
        if states else stack(global_params, num)


def eval_generator(seed: int, round_: int) -> torch.Generator:
    """Fine-tuning batches at evaluation: from ``(seed, round)``, apart from the training
    draws, so a resumed run evaluates exactly as an uninterrupted one."""
    state = np.random.SeedSequence([seed, round_, 0xE7A1]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def evaluate_clients(model: nn.Module, algorithm: Algorithm, loss_fn: LossFn,
                     global_params: Params, client_ids: torch.Tensor, states: dict,
                     tests: ClientTests, train_x: torch.Tensor, train_y: torch.Tensor, *,
                     finetune_steps: int, batch_size: int, train_batch_size: int,
                     generator: torch.Generator, round_: int) -> dict[str, torch.Tensor]:
    """Accuracy of ``client_ids``' personal models (from their stacked ``states``, after
    ``finetune_steps`` fine-tuning steps) and of the global model on their own test data:
    ``{"personal": [C], "global": [C], "sizes": [C]}``."""
    personal = algorithm.personal
    models = personal_models(algorithm, global_params, states, len(client_ids))
    tuner = None if personal is None else personal.finetuner()
    if finetune_steps > 0 and tuner is not None:
        models = finetune(tuner, loss_fn, models, client_ids, tests, train_x, train_y,
                          finetune_steps, train_batch_size, generator, round_)
    own = [tests.indices[int(i)] for i in client_ids]
    acc, sizes = client_accuracy(model, models, tests.x, tests.y, own, True, batch_size)
    glob, _ = client_accuracy(model, global_params, tests.x, tests.y, own, False, batch_size)
    return {"personal": acc, "global": glob, "sizes": sizes}


def evaluate_personal(model: nn.Module, algorithm: Algorithm, loss_fn: LossFn,
                      global_params: Params, gather, tests: ClientTests,
                      train_x: torch.Tensor, train_y: torch.Tensor, *, held_out_steps: int,
                      batch_size: int, train_batch_size: int, seed: int, round_: int,
                      chunk: int = 64) -> dict[str, float]:
    """The protocol's metrics over every client (``gather(ids)``: their stacked client
    states), ``chunk`` clients at a time: the clients that train with the method's own
    fine-tuning steps; the held-out ones start from the global model, as a new client would,
    and take ``held_out_steps``."""
    personal = algorithm.personal
    own_steps = 0 if personal is None else personal.finetune_steps
    held = set(tests.held_out.tolist())
    groups = {"": ([i for i in range(tests.num_clients) if i not in held], own_steps),
              "held_out_": (sorted(held), held_out_steps)}
    out: dict[str, float] = {}
    for prefix, (ids, steps) in groups.items():
        gen = eval_generator(seed, round_)
        parts: dict[str, list] = {"personal": [], "global": [], "sizes": []}
        for lo in range(0, len(ids), chunk):
            cids = torch.tensor(ids[lo:lo + chunk], dtype=torch.int64)
            states = gather(cids) if not prefix else {}  # held out: from the global model
            got = evaluate_clients(
                model, algorithm, loss_fn, global_params, cids, states, tests, train_x,
                train_y, finetune_steps=steps, batch_size=batch_size,
                train_batch_size=train_batch_size, generator=gen, round_=round_)
            for k, v in got.items():
                parts[k].append(v)
        if not ids:
            continue
        sizes = torch.cat(parts["sizes"])
        out.update(summarise(f"{prefix}personal_accuracy", torch.cat(parts["personal"]), sizes))
        out.update(summarise(f"{prefix}global_accuracy", torch.cat(parts["global"]), sizes))
    return out


def is_personal(algorithm: Algorithm) -> bool:
    return algorithm.personal is not None


def personal_data(data, algorithm: Algorithm, *, on: bool | None, fraction: float,
                  held_out: int, finetune_steps: int, seed: int, natural: bool):
    """-> (the run's training data, its :class:`ClientTests`) when the protocol is on
    (``on``, by default for a personalised algorithm), else ``(data, None)``. The
    ``held_out`` highest ids are the clients evaluated after ``finetune_steps`` steps."""
    on = is_personal(algorithm) if on is None else on
    if not on:
        if finetune_steps:
            raise ValueError("eval.finetune_steps: needs the personalised evaluation "
                             "(eval.personal = true, or a personalised algorithm)")
        return data, None
    if finetune_steps and not is_personal(algorithm):
        raise ValueError(f"eval.finetune_steps: {algorithm.name!r} has no personal model to "
                         "fine-tune; use its personalised form (e.g. fedavg_ft)")
    if finetune_steps and not held_out:
        raise ValueError("eval.finetune_steps: fine-tunes the held-out clients; set "
                         "eval.held_out to how many of the highest ids never train")
    return client_split(data, fraction, seed, held_out, natural)
