"""The W1 workload on Flower's simulation engine (``pip install fedforge[bench]``).

A Flower ``ClientApp`` trains the same CNN with ``torch.optim.SGD`` on the client's 10
batches; Flower's ``FedAvg`` strategy aggregates. We time rounds 2..R from inside the
``ServerApp`` (``evaluate_fn`` runs after every round), so Ray's start-up is not charged to
Flower. Client resources: one CPU per client actor, one torch thread per actor.
"""

from __future__ import annotations

import importlib
import sys
import time

import torch

from fedforge.bench.workload import train_client

INSTALL = 'pip install "fedforge[bench]"'


def flower_missing() -> str | None:
    """The first of Flower and Ray that cannot be imported, or None. Flower's simulation
    engine needs both, and ``flwr`` imports without Ray, so both are tried here: a bench run
    asked for the ``flower`` row refuses before it times any other row."""
    for module in ("flwr.simulation", "ray"):
        try:
            importlib.import_module(module)
        except ImportError:
            return module.split(".")[0]
    return None


def check_flower() -> None:
    """A one-line ``ValueError`` naming the fix when the Flower baseline cannot run."""
    missing = flower_missing()
    if missing is not None:
        raise ValueError(f"--engines: flower needs Flower's simulation engine, which is not "
                         f"installed (no module {missing!r}); install it with {INSTALL}")


def flower_round(model, x, y, idx, *, device: torch.device, rounds: int = 3) -> float:
    """Run ``rounds`` Flower rounds of W1 with every client; returns seconds per round (2..R)."""
    try:
        from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
        from flwr.clientapp import ClientApp
        from flwr.serverapp import Grid, ServerApp
        from flwr.serverapp.strategy import FedAvg
        from flwr.simulation import run_simulation
    except ImportError as e:  # pragma: no cover - optional extra
        raise RuntimeError('the Flower baseline needs pip install "fedforge[bench]"') from e

    cohort = idx.shape[0]
    arch = model
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        cid = int(context.node_config["partition-id"])
        net = arch
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        train_client(net, x, y, idx[cid])
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                              "metrics": MetricRecord({"num-examples": int(idx[cid].numel())})})
        return Message(content=content, reply_to=msg)

    stamps: list[float] = []
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=cohort,
                          min_available_nodes=cohort)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(arch.state_dict()),
                       num_rounds=rounds,
                       evaluate_fn=lambda rnd, arrays: stamps.append(time.perf_counter()))

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=cohort,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    # stamps[0] is before round 1, stamps[r] after round r
    return (stamps[-1] - stamps[1]) / (len(stamps) - 2)


if __name__ == "__main__":  # benchmarks/cpu_targets.sh: exit 1 with the fix when missing
    try:
        check_flower()
    except ValueError as exc:
        print(exc)
        sys.exit(1)
