"""SecAgg+ deployments: the server sees only the sum of the nodes' model updates.

Flower's SecAgg+ (Bell et al. 2020) masks each node's update with pairwise and private masks
whose seeds are secret-shared among its neighbours; the server unmasks only the sum, and
recovers it when up to ``num_shares - threshold`` nodes drop out mid-round. Here the nodes run
Flower's ``secaggplus_mod`` around a client that trains one fedforge local round
(:func:`fedforge.flower.client.solo_train`) and uploads its delta ``x - x_i``; the server runs
Flower's ``SecAggPlusWorkflow`` with a strategy that folds the unmasked mean delta into the
fedforge algorithm's own server step (server optimizer included).

Only algorithms whose server uses nothing per client but the delta can run so: no uploads
(SCAFFOLD's control variates, FedExP's norms), no codec, no per-client round inputs, no
client state, and the FedAvg family's plain local training. Others are refused when the
app starts, naming the algorithm. SecAgg+ quantises each coordinate of each delta (clipped
to ``±clipping_range``) onto ``quantization_range`` levels, so the mean carries an error of at
most ``2 · clipping_range / quantization_range`` per coordinate.

Components for ``flwr run``: ``fedforge.flower.secagg:server`` and ``:client``. Run config
keys as for :mod:`fedforge.flower.app` (``fedforge-config``, ``fedforge-overrides``,
``fedforge-out``) plus ``fedforge-secagg-shares`` (shares per node, default: every sampled
node), ``fedforge-secagg-threshold`` (shares to reconstruct, default 2/3 of them),
``fedforge-secagg-clip`` (clipping range, 8.0) and ``fedforge-round-timeout`` (seconds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from fedforge.experiment.config import RunConfig
from fedforge.flower.app import config_from_run, failing_loudly, to_console
from fedforge.flower.client import partition_of, solo_train
from fedforge.flower.common import experiment, logger, standard_message_support
from fedforge.flower.server import round_line, test_metrics
from fedforge.server.chain import Aggregate

SECAGG_SERVES: frozenset[str] = frozenset()
"""What a SecAgg+ server can use per client: nothing but the (summed) delta."""


def check_secagg(cfg: RunConfig) -> None:
    """Refuse, in one line naming the algorithm, what SecAgg+ cannot serve."""
    if cfg.privacy.on:
        raise ValueError("privacy.mode: SecAgg+ deployments carry plain deltas; differential "
                         "privacy runs in simulation only (docs/privacy.md)")
    exp, _ = experiment(cfg)
    needs = sorted(exp.algorithm.needs(exp.initial_params()) - SECAGG_SERVES)
    why = standard_message_support(exp)
    if needs or why:
        what = ", ".join(needs) if needs else why
        raise ValueError(f"algorithm.name: {cfg.algorithm.name!r} cannot run under SecAgg+, "
                         f"whose server sees only the sum of the deltas ({what})")


def _arrays(tree: dict) -> list[np.ndarray]:
    return [v.detach().cpu().numpy() for v in tree.values()]


class DeltaClient(NumPyClient):
    """One node: trains its partition's local round, uploads ``x - x_i`` with weight 1."""

    def __init__(self, cfg: RunConfig, partition: int) -> None:
        self.cfg, self.partition = cfg, partition

    def fit(self, parameters, config):
        exp, _ = experiment(self.cfg)
        names = list(exp.initial_params())
        dtype = torch.get_default_dtype()
        params = {k: torch.as_tensor(a, dtype=dtype, device=exp.device)
                  for k, a in zip(names, parameters)}
        delta, _ = solo_train(self.cfg, int(config["server-round"]), self.partition, params)
        return _arrays(delta), 1, {}  # weight 1: the unmasked sum / count is the uniform mean


class SecAggStrategy(FedAvg):
    """Flower's legacy strategy interface around the fedforge server step."""

    def __init__(self, cfg: RunConfig) -> None:
        check_secagg(cfg)
        exp, _ = experiment(cfg)
        self.cfg, self.exp = cfg, exp
        self.params = exp.initial_params()
        self.state = exp.algorithm.server_init(self.params)
        self.log: list[dict] = []
        n = cfg.server.clients_per_round
        super().__init__(fraction_fit=0.0, min_fit_clients=n, min_available_clients=n,
                         fraction_evaluate=0.0, min_evaluate_clients=0,
                         initial_parameters=ndarrays_to_parameters(_arrays(self.params)),
                         on_fit_config_fn=lambda r: {"server-round": r})

    def aggregate_fit(self, server_round, results, failures):
        """``results`` all carry the same unmasked mean delta (SecAgg+'s only output)."""
        if not results:
            self.log.append({"round": server_round, "nodes": 0})
            return None, {}
        mean = parameters_to_ndarrays(results[0][1].parameters)
        delta = {k: torch.as_tensor(a, dtype=v.dtype, device=v.device)
                 for (k, v), a in zip(self.params.items(), mean)}
        agg = Aggregate(delta, {}, len(results), self.exp.data.num_clients, server_round)
        self.params, self.state = self.exp.algorithm.server_step(self.params, self.state, agg)
        self.log.append({"round": server_round, "nodes": len(results)})
        shown = test_metrics(self.exp, self.params, self.state, server_round, 1)
        logger.info(round_line(server_round, self.cfg.rounds, {
            **shown, "accepted": results, "asked": len(results) + len(failures)}))
        return ndarrays_to_parameters(_arrays(self.params)), {}


class SecAggSettings(NamedTuple):
    """SecAgg+'s settings, checked against the nodes sampled per round."""

    shares: int
    threshold: int
    clip: float
    timeout: float | None


def _int_key(run_config: dict, key: str, default: int) -> int:
    raw = run_config.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"run config: {key}: expected an integer, got {raw!r}")
    return raw


def _positive_key(run_config: dict, key: str, default: float) -> float:
    raw = run_config.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < float("inf"):
        raise ValueError(f"run config: {key}: expected a positive number, got {raw!r}")
    return float(raw)


def secagg_settings(run_config: dict, num_nodes: int) -> SecAggSettings:
    """The ``fedforge-secagg-*`` settings, refused in one line naming the key unless Flower's
    SecAgg+ can run them with ``num_nodes`` sampled nodes (``server.clients_per_round``):
    more than 2 shares, at most one per sampled node, and a threshold in [2, shares)."""
    shares = _int_key(run_config, "fedforge-secagg-shares", num_nodes)
    source = ("" if "fedforge-secagg-shares" in run_config
              else f" (default: server.clients_per_round = {num_nodes})")
    if shares <= 2:
        raise ValueError(f"run config: fedforge-secagg-shares: {shares}{source}; SecAgg+ needs "
                         "more than 2 shares, so at least 3 nodes per round "
                         "(server.clients_per_round >= 3)")
    if shares > num_nodes:
        raise ValueError(f"run config: fedforge-secagg-shares: {shares} exceeds the {num_nodes} "
                         "nodes sampled per round (server.clients_per_round)")
    threshold = _int_key(run_config, "fedforge-secagg-threshold", max(2, -(-2 * shares // 3)))
    if not 2 <= threshold < shares:
        raise ValueError(f"run config: fedforge-secagg-threshold: {threshold}; expected at least "
                         f"2 and fewer than the {shares} shares (fedforge-secagg-shares)")
    clip = _positive_key(run_config, "fedforge-secagg-clip", 8.0)
    timeout = (_positive_key(run_config, "fedforge-round-timeout", 1.0)
               if run_config.get("fedforge-round-timeout", 0) != 0 else None)  # 0: off
    return SecAggSettings(shares, threshold, clip, timeout)


def secagg_workflow(run_config: dict, num_nodes: int) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ server workflow from the run config's ``fedforge-secagg-*`` keys."""
    s = secagg_settings(run_config, num_nodes)
    # max_weight 1: every node weighs 1, and SecAgg+ scales updates by weight / max_weight
    # before quantising (the default 1000 would make the error 1000 times larger)
    return SecAggPlusWorkflow(num_shares=s.shares, reconstruction_threshold=s.threshold,
                              max_weight=1.0, clipping_range=s.clip, timeout=s.timeout)


def serve(grid: Grid, context: Context, base: Path | None = None) -> None:
    """The SecAgg+ ServerApp's body: settings checked first, then the rounds."""
    cfg = config_from_run(context.run_config, base)
    workflow = secagg_workflow(context.run_config, cfg.server.clients_per_round)
    strategy = SecAggStrategy(cfg)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=cfg.rounds),
                           strategy=strategy)
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
    out = str(context.run_config.get("fedforge-out", ""))
    if out:
        from safetensors.torch import save_file  # noqa: PLC0415

        Path(out).with_suffix(".rounds.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in strategy.log))
        save_file({k: v.detach().cpu().contiguous() for k, v in strategy.params.items()}, out)


def server_for(base: str | Path | None = None) -> ServerApp:
    """The SecAgg+ ServerApp; ``base`` as in :func:`fedforge.flower.app.server_for`."""
    folder, server = None if base is None else Path(base), ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        to_console()
        with failing_loudly():
            serve(grid, context, folder)

    return server


def client_for(base: str | Path | None = None) -> ClientApp:
    """The SecAgg+ ClientApp: one fedforge local round under Flower's ``secaggplus_mod``."""
    folder = None if base is None else Path(base)

    def client_fn(context: Context):
        cfg = config_from_run(context.run_config, folder)
        return DeltaClient(cfg, partition_of(context)).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


# one name per assignment: `flwr run` finds components by reading this file's assignments
server = server_for()
client = client_for()
