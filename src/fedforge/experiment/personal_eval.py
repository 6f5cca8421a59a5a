"""The personalised-FL evaluation protocol: every client on its own held-out data.

Each evaluation reports, over the evaluated clients, the mean accuracy, the sample-weighted
mean, the 10th percentile and the worst client, for the clients' personal models
(``personal_accuracy_*``) and, on the same data, for the global model
(``global_accuracy_*``). The held-out clients (``eval.held_out``), which never train, are
reported apart (``held_out_personal_accuracy_*``) after ``eval.finetune_steps`` fine-tuning
steps on their own training samples. Everything is batched over clients (``vmap`` of
``functional_call`` over stacked parameters), and every function here takes the client ids to
evaluate, so a caller may evaluate a sample of clients. Every client's own numbers (test
samples, accuracy and loss of both models) come with the summaries under :data:`PER_CLIENT`;
the run's log writer keeps them in ``client_metrics.npz`` (fedforge.experiment.client_metrics).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from fedforge.core.tree import Params
from fedforge.data.batching import client_batches
from fedforge.data.client_split import ClientTests, client_split
from fedforge.data.federated import gather_round_indices
from fedforge.engine.client_eval import client_scores, perplexities, summarise
from fedforge.engine.local import LossFn, local_update_of
from fedforge.engine.targets import per_position
from fedforge.experiment.client_metrics import OPTIONAL, ClientColumns
from fedforge.experiment.metrics import PER_CLIENT  # the per-client columns' record key
from fedforge.protocol.algorithm import Algorithm


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
    ``{"personal": [C], "personal_loss": [C], "global": [C], "global_loss": [C],
    "sizes": [C]}``."""
    models = personalised(algorithm, loss_fn, global_params, client_ids, states, tests,
                          train_x, train_y, finetune_steps=finetune_steps,
                          train_batch_size=train_batch_size, generator=generator, round_=round_)
    own = [tests.indices[int(i)] for i in client_ids]
    acc, loss, sizes = client_scores(model, models, tests.x, tests.y, own, True, batch_size)
    glob, gloss, _ = client_scores(model, global_params, tests.x, tests.y, own, False,
                                   batch_size)
    extra = {} if algorithm.personal is None else algorithm.personal.accuracies(
        model, models, tests.x, tests.y, own)  # e.g. FedProto's nearest prototype
    return {"personal": acc, "personal_loss": loss, "global": glob, "global_loss": gloss,
            "sizes": sizes, **extra}


def personalised(algorithm: Algorithm, loss_fn: LossFn, global_params: Params,
                 client_ids: torch.Tensor, states: dict, tests: ClientTests,
                 train_x: torch.Tensor, train_y: torch.Tensor, *, finetune_steps: int,
                 train_batch_size: int, generator: torch.Generator, round_: int) -> Params:
    """``client_ids``' personal models as evaluated, stacked: from their ``states``, then
    ``finetune_steps`` steps of the method's fine-tuning on their own training samples."""
    personal = algorithm.personal
    models = personal_models(algorithm, global_params, states, len(client_ids))
    tuner = None if personal is None else personal.finetuner()
    if finetune_steps > 0 and tuner is not None:
        models = finetune(tuner, loss_fn, models, client_ids, tests, train_x, train_y,
                          finetune_steps, train_batch_size, generator, round_)
    return models


def evaluate_personal(model: nn.Module, algorithm: Algorithm, loss_fn: LossFn,
                      global_params: Params, gather, tests: ClientTests,
                      train_x: torch.Tensor, train_y: torch.Tensor, *, held_out_steps: int,
                      batch_size: int, train_batch_size: int, seed: int, round_: int,
                      chunk: int = 64) -> dict:
    """The protocol's metrics over every client (``gather(ids)``: their stacked client
    states), ``chunk`` clients at a time: the clients that train with the method's own
    fine-tuning steps; the held-out ones start from the global model, as a new client would,
    and take ``held_out_steps``. -> the summaries (floats) and, under :data:`PER_CLIENT`,
    every client's columns."""
    out: dict = {}
    columns: list[dict] = []
    for prefix, (ids, steps) in eval_groups(algorithm, tests, held_out_steps).items():
        gen = eval_generator(seed, round_)
        parts: dict[str, list] = {}
        for lo in range(0, len(ids), chunk):
            cids = torch.tensor(ids[lo:lo + chunk], dtype=torch.int64)
            states = gather(cids) if not prefix else {}  # held out: from the global model
            got = evaluate_clients(
                model, algorithm, loss_fn, global_params, cids, states, tests, train_x,
                train_y, finetune_steps=steps, batch_size=batch_size,
                train_batch_size=train_batch_size, generator=gen, round_=round_)
            if algorithm.personal is not None:  # a clustered method's cluster
                got.update(algorithm.personal.client_columns(states, len(cids)))
            for k, v in got.items():
                parts.setdefault(k, []).append(v)
        if not ids:
            continue
        got = {k: torch.cat(v) for k, v in parts.items()}
        out.update(summarise(f"{prefix}personal_accuracy", got["personal"], got["sizes"]))
        out.update(summarise(f"{prefix}global_accuracy", got["global"], got["sizes"]))
        for key in (k for k in got if k.endswith("_accuracy")):  # a method's own rules
            out.update(summarise(f"{prefix}{key}", got[key], got["sizes"]))
        if per_position(tests.y):
            out.update(perplexities(got, prefix))
        columns.append(_columns(ids, bool(prefix), got))
    if columns:
        out[PER_CLIENT] = ClientColumns({k: np.concatenate([c[k] for c in columns])
                                         for k in columns[0]})
    return out


def client_personal_params(algorithm: Algorithm, loss_fn: LossFn, global_params: Params,
                           client_id: int, gather, tests: ClientTests, train_x: torch.Tensor,
                           train_y: torch.Tensor, *, held_out_steps: int,
                           train_batch_size: int, seed: int, round_: int,
                           chunk: int = 64) -> Params:
    """Client ``client_id``'s personal model exactly as :func:`evaluate_personal` evaluated it
    at ``round_``: its chunk of clients is rebuilt, and the fine-tuning draws of the chunks
    before it are replayed, so a fine-tuned model gets the batches it had."""
    for prefix, (ids, steps) in eval_groups(algorithm, tests, held_out_steps).items():
        if client_id not in ids:
            continue
        pos = ids.index(client_id)
        lo = pos - pos % chunk
        gen = eval_generator(seed, round_)
        tunes = algorithm.personal is not None and algorithm.personal.finetuner() is not None
        for before in range(0, lo, chunk):  # the draws fine-tuning took for earlier chunks
            if steps > 0 and tunes:
                client_batches(tests.train_sizes[ids[before:before + chunk]], steps, None,
                               train_batch_size, gen)
        cids = torch.tensor(ids[lo:lo + chunk], dtype=torch.int64)
        models = personalised(algorithm, loss_fn, global_params, cids,
                              gather(cids) if not prefix else {}, tests, train_x, train_y,
                              finetune_steps=steps, train_batch_size=train_batch_size,
                              generator=gen, round_=round_)
        return {k: v[pos - lo] for k, v in models.items()}
    raise ValueError(f"client_id: expected a client id in 0..{tests.num_clients - 1}, "
                     f"got {client_id!r}")


def eval_groups(algorithm: Algorithm, tests: ClientTests, held_out_steps: int
                ) -> dict[str, tuple[list[int], int]]:
    """Metric prefix -> (client ids, fine-tuning steps): the clients that train take the
    method's own steps; the held-out ones (``held_out_``) take ``held_out_steps``."""
    personal = algorithm.personal
    own_steps = 0 if personal is None else personal.finetune_steps
    held = set(tests.held_out.tolist())
    return {"": ([i for i in range(tests.num_clients) if i not in held], own_steps),
            "held_out_": (sorted(held), held_out_steps)}


def _columns(ids: list[int], held_out: bool, got: dict[str, torch.Tensor]) -> dict:
    """One group's per-client columns (see :data:`PER_CLIENT`)."""
    return {"client": np.asarray(ids, dtype=np.int64),
            "held_out": np.full(len(ids), held_out),
            "samples": got["sizes"].numpy().astype(np.int64),
            "personal_accuracy": got["personal"].numpy(),
            "personal_loss": got["personal_loss"].numpy(),
            "global_accuracy": got["global"].numpy(),
            "global_loss": got["global_loss"].numpy(),
            **{k: got[k].numpy() for k in OPTIONAL if k in got}}


def is_personal(algorithm: Algorithm) -> bool:
    return algorithm.personal is not None


def personal_data(data, algorithm: Algorithm, *, on: bool | None, fraction: float,
                  held_out: int, finetune_steps: int, seed: int, natural: bool,
                  validation: float = 0.0):
    """-> (the run's training data, its :class:`ClientTests`) when the protocol is on
    (``on``, by default for a personalised algorithm), else ``(data, None)``. The
    ``held_out`` highest ids are the clients evaluated after ``finetune_steps`` steps.
    ``validation`` > 0: selection mode (:func:`validation_split`)."""
    on = is_personal(algorithm) if on is None else on
    if validation and not on:
        raise ValueError("eval.client_validation: needs the personalised evaluation "
                         "(eval.personal = true, or a personalised algorithm)")
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
    split, tests = client_split(data, fraction, seed, held_out, natural)
    return (split, tests) if not validation else validation_split(split, validation, seed,
                                                                    held_out)


VALIDATION_SALT = 0x5A1D
"""Offsets the seed of the validation carve, so it is not the test carve's shuffle."""


def validation_split(split, fraction: float, seed: int, held_out: int):
    """Selection without test data: ``split`` (the training data less every client's test
    samples, which are dropped here) with ``fraction`` of each client's remaining training
    samples held out as its validation data -> (training data, the validation
    :class:`ClientTests`). The pooled test split is replaced by the pooled validation
    samples, so no metric of the run sees a test sample."""
    train, val = client_split(split, fraction, seed + VALIDATION_SALT, held_out, False)
    pooled = torch.cat([torch.as_tensor(i, dtype=torch.int64) for i in val.indices])
    starts = np.cumsum([0, *[len(i) for i in val.indices]])
    own = [torch.arange(a, b, dtype=torch.int64) for a, b in zip(starts[:-1], starts[1:])]
    train = dataclasses.replace(
        train, test_x=split.train_x[pooled.to(split.train_x.device)],
        test_y=split.train_y[pooled.to(split.train_y.device)], client_test_indices=own,
        name=f"{split.name} (each client's validation split)")
    return train, val
