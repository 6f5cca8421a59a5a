"""One round of the Flower server: sample, send, screen every reply, aggregate, server step,
guard the model (the rounds themselves are :class:`fedforge.flower.driver.FlowerDriver`'s).

Nothing a node sends can crash the loop or set the model on its own: each reply must answer
the message sent to that node this round (its reply-to id and round), is validated
(:mod:`fedforge.flower.checks`), its update norm is bounded, the aggregate can be a robust
one (``server.aggregator``, as in simulation), a server step that makes the model non-finite
is rolled back, and a round without ``min_replies`` valid replies by its timeout is skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedforge.core.tree import Params, flatten_dict, unflatten_dict
from fedforge.engine.evaluate import evaluate
from fedforge.experiment.build import round_generator, sample_round
from fedforge.experiment.config import RunConfig
from fedforge.experiment.runner import Experiment
from fedforge.flower.checks import (
    check_metrics,
    check_partition_claim,
    check_reply_round,
    l2_norm,
    norm_outliers,
    validate_reply,
)
from fedforge.flower.client import local_train
from fedforge.flower.common import (
    SERVER_ROUND,
    logger,
    standard_message_support,
    to_record,
)
from fedforge.protocol.algorithm import NEEDS, check_support
from fedforge.server.chain import Aggregate, ServerState

PROTOCOLS = ("fedforge", "flower")


@dataclass(frozen=True)
class ServerOptions:
    """How the server treats nodes (deployable app: the Flower run config's ``fedforge-*``).

    * ``round_timeout``: seconds a round waits for replies (None: forever);
    * ``query_timeout``: seconds to wait for nodes' ``partition-id`` answers;
    * ``min_replies``: valid replies a round needs; with fewer it is skipped;
    * ``max_norm_ratio``: a reply whose update norm exceeds this times the round's median
      reply norm is rejected (None: off); ``max_norm``: an absolute bound (None: off);
    * ``max_upload_ratio``: the same for a reply's algorithm uploads (SCAFFOLD's control
      variates, ...), looser because a client's first participation uploads far more than a
      repeat visit (16x the median seen in a 6-client SCAFFOLD run);
    * ``protocol``: ``"fedforge"`` (the algorithm's own messages, any algorithm) or
      ``"flower"`` (Flower's standard model-in/model-out messages, FedAvg family only);
    * ``eval_every``: the server evaluates the model on the test set every this many rounds
      and at the last round (None: never), so each round's log line has test metrics.
    """

    round_timeout: float | None = 3600.0
    query_timeout: float | None = 120.0
    min_replies: int = 1
    max_norm_ratio: float | None = 10.0
    max_norm: float | None = None
    max_upload_ratio: float | None = 100.0
    protocol: str = "fedforge"
    eval_every: int | None = 1

    def __post_init__(self) -> None:
        for name in ("round_timeout", "query_timeout", "max_norm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}: expected a positive number (None/0: off), got {value!r}")
        for name in ("max_norm_ratio", "max_upload_ratio"):
            value = getattr(self, name)
            if value is not None and not value >= 1:
                raise ValueError(f"{name}: expected >= 1 (None/0: off), got {value!r}")
        if self.min_replies < 1:
            raise ValueError(f"min_replies: expected >= 1, got {self.min_replies!r}")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"eval_every: expected >= 1 (None/0: off), got {self.eval_every!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: expected one of {list(PROTOCOLS)}, got {self.protocol!r}")


class ServerView(NamedTuple):
    """The server after a step: model, algorithm state, and what the next round sends."""

    params: Params
    state: ServerState
    broadcast: dict
    bytes_down: int  # per sampled client, the algorithm's exact accounting
    bytes_up: int


def server_update(exp: Experiment, params: Params, server_state: ServerState | None = None,
                  mean_delta: Params | None = None, mean_uploads: dict | None = None,
                  num_accepted: int = 0, num_clients: int = 0, round_: int = 0) -> ServerView:
    """Every call into the algorithm's server side, in one place: ``server_state`` None
    initialises; a ``mean_delta`` is folded in by the server step (codec decoding included);
    then the broadcast and byte counts of round ``round_ + 1`` are derived."""
    alg = exp.algorithm
    if server_state is None:
        server_state = alg.server_init(params)
    elif mean_delta is not None:
        params, server_state = alg.server_step(params, server_state, Aggregate(
            mean_delta, mean_uploads or {}, num_accepted, num_clients, round_))
    down, up = alg.message_nbytes(params, server_state, round_ + 1)
    return ServerView(params, server_state, alg.broadcast(server_state), down, up)


def _non_finite(view: ServerView) -> list[str]:
    """Names of model or server-state tensors holding NaN/Inf."""
    flat = {**flatten_dict(view.params), **flatten_dict(view.state.tree(), "state/")}
    return [k for k, v in flat.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not bool(torch.isfinite(v).all())]


FLOWER_SERVES: frozenset[str] = frozenset(NEEDS) - {"prepare", "weighted_uploads", "privacy",
                                                    "client_ids"}
"""The bridge carries client state (in each node's context), uploads, codec messages and
round inputs; per-cohort preparation (FedPTR's trajectory matching) has no message,
uploads are averaged uniformly (no sample-count weighting of part uploads), updates go
out plain (differential privacy runs in simulation only), and no node is told its client id."""


def check_supported(exp: Experiment, options: ServerOptions) -> None:
    cfg = exp.cfg
    if cfg.privacy.on:  # clipping and noise are simulated only (docs/privacy.md)
        raise ValueError("privacy.mode: the Flower bridge sends plain updates; differential "
                         "privacy runs in simulation only")
    check_support(exp.algorithm, exp.initial_params(), "algorithm.name", "Flower bridge",
                  FLOWER_SERVES)
    if cfg.attack.kind != "none" and cfg.attack.fraction > 0:
        raise ValueError("attack: simulated attackers are a simulator feature; in a Flower "
                         "deployment the attackers are real nodes")
    if options.protocol == "flower" and (why := standard_message_support(exp)):
        raise ValueError(f"protocol 'flower': {why}")


def reply_template(exp: Experiment, view: ServerView) -> dict:
    """Expected reply shapes: a dry run of round 1's first client (fresh state)."""
    ids = sample_round(exp, 1).client_ids
    delta, uploads, _, _ = local_train(exp.cfg, 1, int(ids[0]), view.params, view.broadcast,
                                       None)
    return {"delta": {k: v.cpu() for k, v in flatten_dict(delta).items()},
            "uploads": {k: v.cpu() for k, v in flatten_dict(uploads).items()}}


@dataclass
class PartitionMap:
    """fedforge client id -> Flower node id, one node per partition.

    A node claims its partition by answering a QUERY with ``partition-id``. The first valid
    claim wins; a later claim on a partition whose node is still connected is refused and
    logged. A partition is released when its node leaves (it may then be claimed again).
    Every connected node is asked once; unanswered or refused nodes are asked again only
    after they reconnect.
    """

    num_clients: int
    node_of: dict[int, int] = field(default_factory=dict)
    asked: set[int] = field(default_factory=set)

    def refresh(self, grid: Grid, timeout: float | None, round_: int) -> list[dict]:
        """Release partitions of nodes that left, ask new nodes; returns refusals."""
        connected = set(grid.get_node_ids())
        for pid, node in list(self.node_of.items()):
            if node not in connected:
                logger.warning("round %d: node %s (partition %d) left; partition %d is free",
                               round_, node, pid, pid)
                del self.node_of[pid]
        self.asked &= connected
        new = sorted(connected - self.asked)
        if not new:
            return []
        self.asked |= set(new)
        msgs = [Message(content=RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
                for n in new]
        refused = []
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            node = reply.metadata.src_node_id
            try:
                why = self._claim(reply, node, set(new))
            except Exception as exc:  # whatever a hostile reply holds, never crash
                why = f"malformed query reply ({type(exc).__name__}: {exc})"
            if why is not None:
                logger.warning("round %d: refused node %s: %s", round_, node, why)
                refused.append({"node": node, "reason": why})
        missing = sorted(set(range(self.num_clients)) - set(self.node_of))
        if missing:
            logger.info("no node holds partitions %s; they are skipped when sampled", missing)
        return refused

    def _claim(self, reply: Message, node: int, asked: set[int]) -> str | None:
        if node not in asked:
            return "reply from a node that was not asked"
        if reply.has_error():
            return f"query failed: {reply.error.reason}"
        pid = check_partition_claim(reply.content, self.num_clients)
        if isinstance(pid, str):
            return pid
        holder = self.node_of.get(pid)
        if holder is not None and holder != node:
            return f"claims partition {pid}, held by node {holder}"
        if node in self.node_of.values():
            return f"claims partition {pid} but already holds another"
        self.node_of[pid] = node
        return None


class Target(NamedTuple):
    """A node asked to train this round."""

    node: int
    client: int | None  # fedforge client id (None under Flower's standard protocol)
    weight: float  # aggregation weight known to the server (native protocol)
    examples: int | None  # the partition's size, as the server knows it


@dataclass
class Reply:
    """A reply that passed validation."""

    target: Target
    delta: dict  # flat
    uploads: dict  # flat
    num_examples: int
    norms: dict = field(default_factory=dict)  # record -> L2 norm
    metrics: dict = field(default_factory=dict)  # the reply's checked MetricRecord


def _parse(reply: Message, target: Target, template: dict, params_flat: dict,
           protocol: str, round_: int) -> Reply | str:
    """Validate one TRAIN reply; the reply or why it is rejected."""
    if reply.has_error():
        return f"error: {reply.error.reason}"
    arrays = validate_reply(reply.content, template)
    if isinstance(arrays, str):
        return arrays
    metrics = check_metrics(reply.content, target.examples)
    if isinstance(metrics, str):
        return metrics
    if protocol == "fedforge" and (why := check_reply_round(metrics[1], round_)):
        return why  # the content of another round's reply (Flower's messages carry no echo)
    n = metrics[0]
    if protocol == "flower":
        if n < 1:
            return f"metrics/num-examples: {n}, expected >= 1"
        delta = {k: params_flat[k] - v for k, v in arrays[0].items()}
        uploads: dict = {}
    else:
        delta, uploads = arrays
    out = Reply(target, delta, uploads, n, {"delta": l2_norm(delta)}, metrics[1])
    if uploads:
        out.norms["uploads"] = l2_norm(uploads)
    return out


def _screen_norms(replies: list[Reply], options: ServerOptions,
                  relative_delta: bool = True) -> list[tuple[Reply, str]]:
    """Drop replies whose delta (or uploads) norm is out of bounds; returns the dropped.

    ``relative_delta=False`` (uplink codecs): a compressed message is not a delta, and an
    unbiased compressor (random-k, QSGD, MARINA's differences) scales honest messages far
    beyond the round's median, so only the absolute ``max_norm`` bounds it."""
    dropped: dict[int, str] = {}
    ratios = {"delta": options.max_norm_ratio if relative_delta else None,
              "uploads": options.max_upload_ratio}
    for rec, ratio in ratios.items():
        have = [r for r in replies if rec in r.norms]
        reasons = norm_outliers([r.norms[rec] for r in have], ratio, options.max_norm)
        for r, why in zip(have, reasons):
            if why is not None and id(r) not in dropped:
                dropped[id(r)] = f"{rec} {why}"
    out = [(r, dropped[id(r)]) for r in replies if id(r) in dropped]
    replies[:] = [r for r in replies if id(r) not in dropped]
    return out


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


def _robust_mean(exp: Experiment, replies: list[Reply], weights: list[float]
                 ) -> tuple[dict, dict, dict]:
    """The configured robust aggregator over the stacked deltas (uploads: plain mean)."""
    device = exp.device
    stacked = {k: torch.stack([r.delta[k] for r in replies]).to(device) for k in replies[0].delta}
    w = torch.tensor(weights, dtype=torch.float32, device=device)
    mean_flat, info = exp.robust.aggregator.aggregate(stacked, w / w.sum())
    _, mean_uploads = aggregate([(r.delta, r.uploads, 1.0) for r in replies], device)
    shown = {f"robust_{k}": v.tolist() for k, v in info.items()}
    return unflatten_dict(mean_flat), mean_uploads, shown


def round_targets(exp: Experiment, grid: Grid, nodes: PartitionMap | None, round_: int
                  ) -> list[Target]:
    """This round's cohort: fedforge's sampling (native) or a draw over connected nodes."""
    if nodes is not None:
        draw = sample_round(exp, round_)
        sizes = exp.client_sizes
        return [Target(nodes.node_of[c], c, float(draw.agg_weights[i]), int(sizes[c]))
                for i, c in enumerate(draw.client_ids.tolist()) if c in nodes.node_of]
    connected = sorted(grid.get_node_ids())
    num = min(exp.cfg.server.clients_per_round, len(connected))
    pick = torch.randperm(len(connected), generator=round_generator(exp.cfg.seed, round_))
    return [Target(connected[i], None, 1.0, None) for i in sorted(pick[:num].tolist())]


def train_message(view: ServerView, target: Target, round_: int, options: ServerOptions
                  ) -> Message:
    if options.protocol == "flower":
        content = RecordDict({"arrays": to_record(view.params),
                              "config": ConfigRecord({SERVER_ROUND: round_})})
    else:
        content = RecordDict({"arrays": to_record(view.params),
                              "broadcast": to_record(view.broadcast),
                              "config": ConfigRecord({"round": round_,
                                                      "client-id": target.client})})
    return Message(content=content, dst_node_id=target.node, message_type=MessageType.TRAIN,
                   ttl=options.round_timeout, group_id=str(round_))


def _unanswered(reply: Message, sent: Message, round_: int) -> str | None:
    """Why ``reply`` does not answer ``sent``, the message its node got this round: another
    message id (once the grid has set ids) or another round (the group id)."""
    meta, sent_id = reply.metadata, sent.metadata.message_id
    if sent_id and meta.reply_to_message_id != sent_id:
        return (f"answers message {str(meta.reply_to_message_id)[:16]!r}, not the one sent "
                f"to it in round {round_} (a stale or replayed reply)")
    if meta.group_id != str(round_):
        return (f"answers round {str(meta.group_id)[:16]!r}'s message, not round {round_}'s "
                "(a stale or replayed reply)")
    return None


def _who(node: int, client: int | None) -> str:
    return f"node {node}" + (f" (partition {client})" if client is not None else "")


def _reject(info: dict, round_: int, node: int, client: int | None, why: str) -> None:
    logger.warning("round %d: rejected reply of %s: %s", round_, _who(node, client), why)
    info["rejected"].append({"node": node, "client": client, "reason": why})


def wait_for_nodes(grid: Grid, count: int, timeout: float | None) -> None:
    """Wait (up to ``timeout``) until ``count`` nodes are connected, as Flower's strategies
    do, so a run started before its SuperNodes does not skip its first rounds."""
    end = time.monotonic() + (timeout or 0.0)
    while len(list(grid.get_node_ids())) < count and time.monotonic() < end:
        time.sleep(1.0)


def screen_replies(replies, targets: list[Target], template: dict, view: ServerView,
                   options: ServerOptions, info: dict, round_: int,
                   relative_delta: bool = True, msgs: list[Message] | None = None
                   ) -> list[Reply]:
    """Validate every reply and bound its norm; rejections and silent nodes go to ``info``
    and the log. Returns the accepted replies in the simulator's order.

    ``msgs`` are the messages sent (``targets``' order): a reply that answers none of them
    is rejected without using up its node's place, so the node's real reply still counts."""
    pending = {tg.node: tg for tg in targets}
    sent = {tg.node: m for tg, m in zip(targets, msgs or [])}
    params_flat = {k: v.cpu() for k, v in flatten_dict(view.params).items()}
    accepted: list[Reply] = []
    for reply in replies:
        node = reply.metadata.src_node_id
        target = pending.get(node)
        why = ("unexpected reply (node not asked, or a second reply)" if target is None
               else _unanswered(reply, sent[node], round_) if node in sent else None)
        if why is not None:
            _reject(info, round_, node, None if target is None else target.client, why)
            continue
        del pending[node]
        try:
            got = _parse(reply, target, template, params_flat, options.protocol, round_)
        except Exception as exc:  # whatever a hostile reply holds, never crash
            got = f"malformed reply ({type(exc).__name__}: {exc})"
        if isinstance(got, str):
            _reject(info, round_, node, target.client, got)
        else:
            accepted.append(got)
    for r, why in _screen_norms(accepted, options, relative_delta):
        _reject(info, round_, r.target.node, r.target.client, why)
    info["silent"] = sorted(pending)  # asked, no reply within the round timeout
    for node, target in pending.items():
        logger.warning("round %d: no reply from %s within %s s", round_,
                       _who(node, target.client), options.round_timeout)
    accepted.sort(key=lambda r: r.target.node if r.target.client is None else r.target.client)
    return accepted


def _weights(cfg: RunConfig, accepted: list[Reply]) -> list[float]:
    """Native: the server's own weights; Flower's protocol: ``num-examples`` (reported by
    the node) when ``server.aggregation = "num_samples"``, else uniform."""
    if cfg.server.aggregation != "num_samples":
        return [r.target.weight for r in accepted]
    return [r.target.weight if r.target.client is not None else float(r.num_examples)
            for r in accepted]


def aggregate_step(exp: Experiment, view: ServerView, accepted: list[Reply],
                   options: ServerOptions, info: dict, round_: int) -> ServerView:
    """Aggregate and step, or skip the round (too few replies) or roll it back (non-finite)."""
    weights = _weights(exp.cfg, accepted)
    if len(accepted) < options.min_replies or sum(weights) <= 0:
        info["skipped"] = (f"{len(accepted)} valid replies of {info['asked']} asked "
                           f"(min_replies {options.min_replies})")
        logger.warning("round %d: %s within the %s s round timeout; the round is skipped and "
                       "the model is unchanged", round_, info["skipped"], options.round_timeout)
        return server_update(exp, view.params, view.state, round_=round_)
    if exp.robust is not None:
        mean_delta, mean_uploads, robust_info = _robust_mean(exp, accepted, weights)
        info.update(robust_info)
    else:
        mean_delta, mean_uploads = aggregate(
            [(r.delta, r.uploads, w) for r, w in zip(accepted, weights)], exp.device)
    new = server_update(exp, view.params, view.state, mean_delta, mean_uploads, len(accepted),
                        exp.data.num_clients, round_)
    if bad := _non_finite(new):
        logger.error("round %d: the server step made %s non-finite; rolled back to the "
                     "previous model", round_, bad[:3])
        info["rolled_back"] = True
        return server_update(exp, view.params, view.state, round_=round_)
    return new


def train_loss(accepted: list[Reply]) -> float | None:
    """Mean training loss of the accepted replies that trained (as the simulator's
    ``train_loss``): fedforge clients report ``loss``, Flower's quickstart ``train_loss``."""
    losses = [float(m.get("loss", m.get("train_loss")))
              for m in (r.metrics for r in accepted)
              if ("loss" in m or "train_loss" in m) and m.get("steps", 1) > 0]
    return sum(losses) / len(losses) if losses else None


def test_metrics(exp: Experiment, params: Params, state: ServerState, round_: int,
                 every: int | None) -> dict:
    """Test metrics of the model on evaluated rounds (every ``every`` rounds and the last), as
    the simulator's ``metrics.jsonl`` has them; ``{}`` on other rounds."""
    cfg, data = exp.cfg, exp.data
    if every is None or (round_ % every and round_ != cfg.rounds):
        return {}
    return evaluate(exp.network, exp.algorithm.eval_params(params, state),
                    data.test_x, data.test_y, cfg.eval.batch_size,
                    data.client_test_indices if cfg.eval.per_client else None)


def round_line(round_: int, rounds: int, info: dict) -> str:
    """One console line per round: what a user watching ``flwr run --stream`` needs."""
    shown = [f"{k} {info[k]:.4f}" for k in ("train_loss", "test_loss", "test_accuracy")
             if info.get(k) is not None]
    line = f"round {round_}/{rounds}: " + (", ".join(shown) or "no loss (no replies)")
    line += f" ({len(info['accepted'])} of {info['asked']} replies accepted"
    line += ", skipped)" if info.get("skipped") else ")"
    return line + (" [rolled back]" if info.get("rolled_back") else "")
