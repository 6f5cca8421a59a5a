"""The client side: a node runs its partition's local round of the fedforge algorithm.

Two message forms are answered. fedforge's own (``"broadcast"`` record and ``"client-id"``
in the config, sent by :func:`fedforge.flower.run_server`): the client rebuilds the round's
batch schedule of the simulator's cohort and replies ``delta`` + ``uploads`` + ``metrics``
(which echo the round answered, ``"server-round"``).
Flower's standard form (one model ``ArrayRecord`` and a config with ``"server-round"``, as
sent by ``flwr.serverapp.strategy.FedAvg`` and friends): the client trains the FedAvg family's
plain local round on a schedule of its own and replies the trained model under the same
record key plus ``metrics`` with ``"num-examples"``, so the ClientApp runs unchanged under
Flower's strategies.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedforge.core.tree import Params, flatten_dict, tree_map, tree_nbytes
from fedforge.data.batching import client_batches
from fedforge.data.federated import gather_round_indices
from fedforge.engine.base import CohortInputs
from fedforge.engine.evaluate import evaluate
from fedforge.experiment.build import sample_round
from fedforge.experiment.config import RunConfig
from fedforge.experiment.runner import Experiment
from fedforge.flower.common import (
    NUM_EXAMPLES,
    SERVER_ROUND,
    STATE_KEY,
    experiment,
    from_record,
    standard_message_support,
    to_record,
)

SOLO_TAG = 0xF10E  # separates a standard-message client's schedule from the round RNG


def _run_one(exp: Experiment, round_: int, params: Params, broadcast: dict, state: dict,
             sample_idx: torch.Tensor, weights: torch.Tensor, info: dict
             ) -> tuple[dict, dict, dict, dict]:
    """The algorithm's local update on a one-client cohort (the LoopEngine path)."""
    _, loss_fn = experiment(exp.cfg)
    inputs = CohortInputs(
        global_params=params,
        broadcast={**broadcast, "round": torch.tensor(float(round_), device=exp.device)},
        client_states=tree_map(lambda s: s.unsqueeze(0), state),
        info=info, sample_idx=sample_idx, weights=weights,
        agg_weights=torch.ones(1, device=exp.device),
    )
    out = exp.engine.run_cohort(exp.algorithm, loss_fn, exp.data.train_x, exp.data.train_y,
                                inputs)
    new_state = tree_map(lambda s: s[0], out.client_states)
    metrics = {k: float(v[0]) for k, v in flatten_dict(out.metrics.as_dict()).items()
               if isinstance(v, torch.Tensor) and v.ndim == 1}  # per-client values
    return out.mean_delta, out.mean_uploads, new_state, metrics


def local_train(cfg: RunConfig, round_: int, client_id: int, params: Params, broadcast: dict,
                state: dict | None) -> tuple[dict, dict, dict, dict]:
    """One client's local round, identical to its row of the simulator's cohort.

    Returns ``(delta, uploads, new_state, metrics)``; ``state`` None means a fresh client,
    whose state starts, as in the simulator, from the initial model (FedALA's and Ditto's
    local models are the initial model until the client is first sampled)."""
    exp, _ = experiment(cfg)
    draw = sample_round(exp, round_)
    rows = (draw.client_ids == client_id).nonzero().flatten()
    if rows.numel() != 1:
        raise ValueError(f"client {client_id} is not in round {round_}'s cohort")
    r = slice(int(rows[0]), int(rows[0]) + 1)
    if state is None:
        state = exp.algorithm.client_init(exp.initial_params())
    return _run_one(exp, round_, params, broadcast, state, draw.sample_idx[r], draw.weights[r],
                    {k: v[r] for k, v in draw.info.items()})


def solo_train(cfg: RunConfig, round_: int, client_id: int, params: Params
               ) -> tuple[dict, dict]:
    """A FedAvg-family local round outside fedforge's sampling (under a Flower strategy):
    the batch schedule is drawn from ``(seed, round, client id)``. Returns (delta, metrics)."""
    exp, _ = experiment(cfg)
    why = standard_message_support(exp)
    if why is not None:
        raise ValueError(why)
    entropy = np.random.SeedSequence([cfg.seed, round_, client_id, SOLO_TAG]).generate_state(1)
    gen = torch.Generator().manual_seed(int(entropy[0]))
    ids = torch.tensor([client_id])
    c = cfg.client
    pos, weights = client_batches(exp.client_sizes[ids], c.local_steps, c.local_epochs,
                                  c.batch_size, gen)
    sample_idx = gather_round_indices(exp.data.index_table, ids, pos)
    info = {k: v.to(exp.device) for k, v in exp.algorithm.round_info(1, gen).items()}
    delta, uploads, _, metrics = _run_one(exp, round_, params, {}, {},
                                          sample_idx.to(exp.device), weights.to(exp.device),
                                          info)
    if flatten_dict(uploads):
        raise ValueError(f"algorithm {cfg.algorithm.name!r} uploads more than the model; "
                         "it needs fedforge's own protocol")
    return delta, metrics


def partition_of(context: Context) -> int:
    """The fedforge client id this node holds (node config ``partition-id``)."""
    if "partition-id" not in context.node_config:
        raise ValueError("node config: 'partition-id' is required "
                         "(flower-supernode --node-config 'partition-id=0')")
    return int(context.node_config["partition-id"])


def answer_query(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Tell the server which fedforge client (``partition-id``) this node holds."""
    content = RecordDict({"config": ConfigRecord({"partition-id": partition_of(context)})})
    return Message(content=content, reply_to=msg)


def answer_train(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Run the local round asked for, in fedforge's or Flower's standard message form."""
    conf = msg.content.config_records.get("config", ConfigRecord())
    if "client-id" in conf and "broadcast" in msg.content.array_records:
        return _answer_fedforge(cfg, msg, context)
    return _answer_standard(cfg, msg, context)


def _answer_fedforge(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """fedforge's protocol: per-client state persists in ``context.state``."""
    exp, _ = experiment(cfg)
    conf = msg.content["config"]
    cid, round_ = int(conf["client-id"]), int(conf["round"])
    if cid != partition_of(context):
        raise ValueError(f"node holds partition {partition_of(context)}, "
                         f"server asked for client {cid}")
    params = from_record(msg.content["arrays"], exp.device)
    broadcast = from_record(msg.content["broadcast"], exp.device)
    state = (from_record(context.state[STATE_KEY], exp.device)
             if STATE_KEY in context.state else None)
    delta, uploads, new_state, metrics = local_train(cfg, round_, cid, params, broadcast, state)
    if flatten_dict(new_state):  # SCAFFOLD c_i, FAdamGC y_i / v_i, codec residuals
        context.state[STATE_KEY] = to_record(new_state)
    metrics["array-bytes-up"] = tree_nbytes(delta) + tree_nbytes(uploads)
    metrics[NUM_EXAMPLES] = int(exp.client_sizes[cid])
    metrics[SERVER_ROUND] = round_  # ties the reply's content to the round it answers
    content = RecordDict({"delta": to_record(delta), "uploads": to_record(uploads),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def _model_in(exp: Experiment, msg: Message) -> tuple[str, Params]:
    """The one model ``ArrayRecord`` of a standard message, checked against the model."""
    records = msg.content.array_records
    if len(records) != 1:
        raise ValueError(f"expected one model ArrayRecord, got {sorted(records)}")
    key, rec = next(iter(records.items()))
    flat = rec.to_torch_state_dict()
    expected = exp.initial_params()
    if set(flat) != set(expected):
        raise ValueError(f"{key}: arrays {sorted(flat)} do not match the model's parameters "
                         f"{sorted(expected)}")
    return key, {k: flat[k].to(exp.device, expected[k].dtype) for k in expected}


def _answer_standard(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Flower's standard form: model in, trained model + metrics with num-examples out."""
    exp, _ = experiment(cfg)
    cid = partition_of(context)
    configs = list(msg.content.config_records.values())
    round_ = int(configs[0].get(SERVER_ROUND, 1)) if configs else 1
    key, params = _model_in(exp, msg)
    delta, metrics = solo_train(cfg, round_, cid, params)
    trained = {k: params[k] - delta[k] for k in params}
    metrics[NUM_EXAMPLES] = int(exp.client_sizes[cid])
    content = RecordDict({key: ArrayRecord({k: v.detach().cpu().contiguous()
                                            for k, v in trained.items()}),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def answer_evaluate(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on the node's own test samples (its training
    samples when the split has no per-client test set), for Flower's federated evaluation."""
    exp, _ = experiment(cfg)
    cid = partition_of(context)
    _, params = _model_in(exp, msg)
    data = exp.data
    if data.client_test_indices is not None:
        idx = data.client_test_indices[cid].to(data.test_x.device)
        x, y = data.test_x[idx], data.test_y[idx]
    else:
        idx = data.client_indices[cid].to(data.train_x.device)
        x, y = data.train_x[idx], data.train_y[idx]
    res = evaluate(exp.network, params, x, y, cfg.eval.batch_size) if len(idx) else {
        "test_loss": 0.0, "test_accuracy": 0.0}
    metrics = MetricRecord({"eval_loss": float(res["test_loss"]),
                            "eval_acc": float(res["test_accuracy"]), NUM_EXAMPLES: int(len(idx))})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def client_app(cfg: RunConfig) -> ClientApp:
    """A Flower ClientApp running ``cfg``'s algorithm for the node's ``partition-id``."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return answer_query(cfg, msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return answer_train(cfg, msg, context)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        return answer_evaluate(cfg, msg, context)

    return app
