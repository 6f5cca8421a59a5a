"""Run any fedforge algorithm as a Flower ``ServerApp`` + ``ClientApp``.

The maths stays fedforge's: a client runs the algorithm's pure local update on a one-client
cohort (the ``LoopEngine`` path) and replies with its delta (or codec message) and its part
uploads; the server samples the cohort exactly as :func:`fedforge.experiment.build.sample_round`
and aggregates with the algorithm's own server step (or the configured robust aggregator).
Flower only carries arrays.

Protocol per round t (``protocol="fedforge"``): the server sends each sampled client's node a
TRAIN message with the model (``"arrays"``), the algorithm's broadcast (``"broadcast"``) and
``{"round": t, "client-id": i}`` (``"config"``); the client rebuilds the round's batch
schedule from ``(seed, t)`` itself, so no indices travel. Node ids are mapped to fedforge
client ids by QUERY messages answered with the node's ``partition-id`` (one node per
partition). ``protocol="flower"`` speaks Flower's standard messages instead (model in,
trained model + ``num-examples`` out), so plain Flower ClientApps can join a FedAvg-family
run; the fedforge ClientApp answers both, and runs under Flower's own strategies.

Every reply is screened (:mod:`fedforge.flower.checks`, :mod:`fedforge.flower.server`):
records, names, shapes, dtypes, NaN/Inf, metrics and ``num-examples``, and the update norm
against the round's median. A rejection is logged with the node and partition and the round
proceeds with the remaining clients (aggregation weights renormalised over them).

Bytes: a reply carries its arrays' size (``"array-bytes-up"`` in its metrics); the server
reports per round the algorithm's exact accounting (``bytes_up``/``bytes_down``: the codec's
encoded size for compressed uplinks, as in the simulator's ``metrics.jsonl``) beside the
bytes of the arrays that actually arrived (``array_bytes_up``), and running totals.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedforge.core.tree import Params
from fedforge.experiment.config import RunConfig
from fedforge.flower.checks import check_metrics, check_partition_claim, validate_reply
from fedforge.flower.client import (
    answer_evaluate,
    answer_query,
    answer_train,
    client_app,
    local_train,
    solo_train,
)
from fedforge.flower.common import experiment
from fedforge.flower.driver import run_server
from fedforge.flower.server import PartitionMap, ServerOptions, aggregate


def server_app(cfg: RunConfig, options: ServerOptions | None = None, *,
               on_round: Callable[[int, Params, dict], None] | None = None) -> ServerApp:
    """A Flower ServerApp running ``cfg.rounds`` rounds of ``cfg``'s algorithm."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg, options, on_round=on_round)

    return app


def build_apps(cfg: RunConfig, options: ServerOptions | None = None, *,
               on_round: Callable[[int, Params, dict], None] | None = None
               ) -> tuple[ServerApp, ClientApp]:
    return server_app(cfg, options, on_round=on_round), client_app(cfg)


__all__ = ["PartitionMap", "ServerOptions", "aggregate", "answer_evaluate", "answer_query",
           "answer_train", "build_apps", "check_metrics", "check_partition_claim",
           "client_app", "experiment", "local_train", "run_server", "server_app", "solo_train",
           "validate_reply"]
