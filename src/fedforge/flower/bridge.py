"""Run any fedforge algorithm as a Flower ``ServerApp`` + ``ClientApp`` (issue 10, part 2).

The maths stays fedforge's: a client runs the algorithm's pure local update on a one-client
cohort (the ``LoopEngine`` path) and replies with its delta (or codec message) and its part
uploads; the server samples the cohort exactly as :func:`fedforge.experiment.runner.sample_round`
and aggregates with the algorithm's own ``server_step``. Flower only carries arrays.

Protocol per round t: the server sends each sampled client's node a TRAIN message with the
model (``"arrays"``), the algorithm's broadcast (``"broadcast"``) and ``{"round": t,
"client-id": i}`` (``"config"``); the client rebuilds the round's batch schedule from
``(seed, t)`` itself, so no indices travel. Node ids are mapped to fedforge client ids once
by a QUERY message answered with the node's ``partition-id``.

Replies are validated (:func:`validate_reply`): missing or extra keys, wrong shapes or
dtypes and NaN/Inf are rejected, logged with the node id, and the round proceeds with the
remaining clients (aggregation weights renormalised over them).

Bytes: a reply carries its arrays' size (``"array-bytes-up"`` in its metrics); the server
reports per round the algorithm's exact accounting (``bytes_up``/``bytes_down``: the codec's
encoded size for compressed uplinks, as in the simulator's ``metrics.jsonl``) beside the
bytes of the arrays that actually arrived (``array_bytes_up``), and running totals.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

import torch

from fedforge.core.store import ClientStore
from fedforge.core.tree import Params, flatten_dict, tree_map, tree_nbytes, unflatten_dict
from fedforge.engine import classification_loss
from fedforge.engine.base import CohortInputs
from fedforge.engine.loop import LoopEngine
from fedforge.experiment.config import RunConfig
from fedforge.experiment.runner import Experiment, sample_round

try:
    from flwr.app import (
        ArrayRecord,
        ConfigRecord,
        Context,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as e:  # pragma: no cover - optional extra
    raise ImportError(
        "fedforge.flower needs the Flower extra: pip install 'fedforge[flower]'") from e

logger = logging.getLogger(__name__)
STATE_KEY = "fedforge-client-state"  # the ArrayRecord in context.state holding c_i, y_i, ...
_EXPERIMENTS: dict[str, tuple[Experiment, Callable]] = {}  # per-process cache, by config


def _experiment(cfg: RunConfig) -> tuple[Experiment, Callable]:
    """Build (once per process) the experiment: the same data, partition and model as a run."""
    key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, default=str)
    if key not in _EXPERIMENTS:
        exp = Experiment.from_config(cfg)
        exp.engine = LoopEngine()  # one client per call: the reference engine
        _EXPERIMENTS[key] = (exp, classification_loss(exp.model, cfg.engine.precision))
    return _EXPERIMENTS[key]


def _check_supported(exp: Experiment) -> None:
    cfg = exp.cfg
    if exp.algorithm.prepares:
        raise ValueError(f"algorithm.name: {cfg.algorithm.name!r} needs a server/cohort "
                         "preparation step, which the Flower bridge does not carry")
    if exp.robust is not None:
        raise ValueError("robust: attacks / robust aggregators are not supported by the "
                         "Flower bridge (replies are validated instead)")


def _to_record(tree: dict) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in flatten_dict(tree).items()})


def _from_record(rec: ArrayRecord, device: torch.device) -> dict:
    return unflatten_dict({k: v.to(device) for k, v in rec.to_torch_state_dict().items()})


def local_train(cfg: RunConfig, round_: int, client_id: int, params: Params, broadcast: dict,
                state: dict | None) -> tuple[dict, dict, dict, dict]:
    """One client's local round, identical to its row of the simulator's cohort.

    Returns ``(delta, uploads, new_state, metrics)``; ``state`` None means a fresh client.
    """
    exp, loss_fn = _experiment(cfg)
    ids, sample_idx, weights, _, info = sample_round(exp, round_)
    rows = (ids == client_id).nonzero().flatten()
    if rows.numel() != 1:
        raise ValueError(f"client {client_id} is not in round {round_}'s cohort")
    r = slice(int(rows[0]), int(rows[0]) + 1)
    if state is None:
        state = exp.algorithm.client_init(params)
    inputs = CohortInputs(
        global_params=params,
        broadcast={**broadcast, "round": torch.tensor(float(round_), device=exp.device)},
        client_states=tree_map(lambda s: s.unsqueeze(0), state),
        info={k: v[r] for k, v in info.items()},
        sample_idx=sample_idx[r], weights=weights[r],
        agg_weights=torch.ones(1, device=exp.device),
    )
    out = exp.engine.run_cohort(exp.algorithm, loss_fn, exp.data.train_x, exp.data.train_y,
                                inputs)
    new_state = tree_map(lambda s: s[0], out.client_states)
    metrics = {k: float(v[0]) for k, v in out.metrics.items() if v.ndim == 1}
    return out.mean_delta, out.mean_uploads, new_state, metrics


def answer_query(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Tell the server which fedforge client (``partition-id``) this node holds."""
    pid = int(context.node_config["partition-id"])
    return Message(content=RecordDict({"config": ConfigRecord({"partition-id": pid})}),
                   reply_to=msg)


def answer_train(cfg: RunConfig, msg: Message, context: Context) -> Message:
    """Run the local round asked for; per-client state persists in ``context.state``."""
    exp, _ = _experiment(cfg)
    conf = msg.content["config"]
    cid, round_ = int(conf["client-id"]), int(conf["round"])
    if cid != int(context.node_config["partition-id"]):
        raise ValueError(f"node holds partition {context.node_config['partition-id']}, "
                         f"server asked for client {cid}")
    params = _from_record(msg.content["arrays"], exp.device)
    broadcast = _from_record(msg.content["broadcast"], exp.device)
    state = (_from_record(context.state[STATE_KEY], exp.device)
             if STATE_KEY in context.state else None)
    delta, uploads, new_state, metrics = local_train(cfg, round_, cid, params, broadcast, state)
    if flatten_dict(new_state):  # SCAFFOLD c_i, FAdamGC y_i / v_i, codec residuals
        context.state[STATE_KEY] = _to_record(new_state)
    metrics["array-bytes-up"] = tree_nbytes(delta) + tree_nbytes(uploads)
    content = RecordDict({"delta": _to_record(delta), "uploads": _to_record(uploads),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def client_app(cfg: RunConfig) -> ClientApp:
    """A Flower ClientApp running ``cfg``'s algorithm for the node's ``partition-id``."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return answer_query(cfg, msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return answer_train(cfg, msg, context)

    return app


def validate_reply(content: RecordDict, template: dict[str, dict[str, torch.Tensor]]
                   ) -> tuple[dict, dict] | str:
    """Check one reply against the expected flat shapes; returns (delta, uploads) or a reason.

    ``template`` is ``{"delta": {name: tensor}, "uploads": {name: tensor}}``.
    """
    got: dict[str, dict[str, torch.Tensor]] = {}
    for rec, expected in template.items():
        if rec not in content.array_records:
            return f"missing record {rec!r}"
        try:
            flat = content.array_records[rec].to_torch_state_dict()
        except Exception as exc:  # undecodable arrays
            return f"{rec}: cannot decode arrays ({exc})"
        missing, extra = set(expected) - set(flat), set(flat) - set(expected)
        if missing or extra:
            return f"{rec}: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}"
        for name, ref in expected.items():
            t = flat[name]
            if tuple(t.shape) != tuple(ref.shape):
                return f"{rec}/{name}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
            if t.dtype != ref.dtype:
                return f"{rec}/{name}: dtype {t.dtype}, expected {ref.dtype}"
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{rec}/{name}: NaN or Inf"
        got[rec] = flat
    return got["delta"], got["uploads"]


def aggregate(accepted: list[tuple[dict, dict, float]], device: torch.device
              ) -> tuple[dict, dict]:
    """Weighted mean delta (weights renormalised over accepted clients) and uniform mean
    uploads, in the order the simulator's engine folds them."""
    total = sum(w for _, _, w in accepted)
    mean_delta: dict | None = None
    upload_sum: dict | None = None
    for delta, uploads, w in accepted:
        wd = {k: (w / total) * v.to(device) for k, v in delta.items()}
        mean_delta = wd if mean_delta is None else {k: mean_delta[k] + wd[k] for k in wd}
        up = {k: v.to(device) for k, v in uploads.items()}
        upload_sum = up if upload_sum is None else {k: upload_sum[k] + up[k] for k in up}
    n = len(accepted)
    return (unflatten_dict(mean_delta or {}),
            unflatten_dict({k: v / n for k, v in (upload_sum or {}).items()}))


def _reply_template(exp: Experiment, params: Params, server_state: dict) -> dict:
    """Expected reply shapes: a dry run of round 1's first client (fresh state)."""
    ids = sample_round(exp, 1)[0]
    bc = exp.algorithm.broadcast(server_state)
    delta, uploads, _, _ = local_train(exp.cfg, 1, int(ids[0]), params, bc, None)
    return {"delta": {k: v.cpu() for k, v in flatten_dict(delta).items()},
            "uploads": {k: v.cpu() for k, v in flatten_dict(uploads).items()}}


def _node_map(grid: Grid, num_clients: int, timeout: float | None) -> dict[int, int]:
    """fedforge client id -> Flower node id, from each node's ``partition-id``."""
    msgs = [Message(content=RecordDict(), dst_node_id=nid, message_type=MessageType.QUERY)
            for nid in grid.get_node_ids()]
    out: dict[int, int] = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        if reply.has_error():
            logger.warning("node %s: query failed: %s", reply.metadata.src_node_id, reply.error)
            continue
        out[int(reply.content["config"]["partition-id"])] = reply.metadata.src_node_id
    missing = sorted(set(range(num_clients)) - set(out))
    if missing:
        logger.warning("no node holds partitions %s; they are skipped when sampled", missing)
    return out


def run_server(grid: Grid, cfg: RunConfig, *, timeout: float | None = None,
               on_round: Callable[[int, Params, dict], None] | None = None) -> Params:
    """The server loop: sample, send, validate, aggregate, server step; returns the model."""
    exp, _ = _experiment(cfg)
    _check_supported(exp)
    params = exp.initial_params()
    server_state = exp.algorithm.server_init(params)
    num_clients = exp.data.num_clients
    store = ClientStore(num_clients, {}, exp.device)  # only for num_clients in server_step
    template = _reply_template(exp, params, server_state)
    nodes = _node_map(grid, num_clients, timeout)
    totals = {"bytes_up_total": 0, "bytes_down_total": 0}
    for t in range(1, cfg.rounds + 1):
        client_ids, _, _, agg, _ = sample_round(exp, t)
        bc = exp.algorithm.broadcast(server_state)
        down_per_client, up_per_client = exp.algorithm.message_nbytes(params, server_state, t)
        msgs, weight_of = [], {}
        for row, cid in enumerate(client_ids.tolist()):
            if cid not in nodes:
                continue
            weight_of[nodes[cid]] = (cid, float(agg[row]))
            content = RecordDict({"arrays": _to_record(params), "broadcast": _to_record(bc),
                                  "config": ConfigRecord({"round": t, "client-id": cid})})
            msgs.append(Message(content=content, dst_node_id=nodes[cid],
                                message_type=MessageType.TRAIN))
        accepted, info = [], {"rejected": []}
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            node = reply.metadata.src_node_id
            cid, w = weight_of.get(node, (None, 0.0))
            why = (f"error: {reply.error}" if reply.has_error() else
                   "unknown node" if cid is None else validate_reply(reply.content, template))
            if isinstance(why, str):
                logger.warning("round %d: rejected reply of node %s (client %s): %s",
                               t, node, cid, why)
                info["rejected"].append({"node": node, "client": cid, "reason": why})
                continue
            accepted.append((*why, w, cid))
        accepted.sort(key=lambda a: a[3])  # the simulator's order: ascending client id
        info["accepted"] = [a[3] for a in accepted]
        info["bytes_down"] = down_per_client * len(msgs)
        info["bytes_up"] = up_per_client * len(accepted)
        info["array_bytes_up"] = sum(tree_nbytes(a[0]) + tree_nbytes(a[1]) for a in accepted)
        totals["bytes_up_total"] += info["bytes_up"]
        totals["bytes_down_total"] += info["bytes_down"]
        info.update(totals)
        if not accepted or sum(a[2] for a in accepted) <= 0:
            logger.warning("round %d: no valid replies; the model is unchanged", t)
        else:
            mean_delta, mean_uploads = aggregate([a[:3] for a in accepted], exp.device)
            if exp.algorithm.codec is not None:
                mean_delta, server_state = exp.algorithm.decode_uplink(
                    mean_delta, server_state, params, t)
            params, server_state = exp.algorithm.server_step(
                params, server_state, mean_delta, mean_uploads, len(accepted), store.num_clients)
        if on_round is not None:
            on_round(t, params, info)
    return params


def server_app(cfg: RunConfig, *, timeout: float | None = None,
               on_round: Callable[[int, Params, dict], None] | None = None) -> ServerApp:
    """A Flower ServerApp running ``cfg.rounds`` rounds of ``cfg``'s algorithm."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg, timeout=timeout, on_round=on_round)

    return app


def build_apps(cfg: RunConfig, **server_kw) -> tuple[ServerApp, ClientApp]:
    return server_app(cfg, **server_kw), client_app(cfg)


__all__: Iterable[str] = ["aggregate", "answer_query", "answer_train", "build_apps",
                          "client_app", "local_train",
                          "run_server", "server_app", "validate_reply"]
