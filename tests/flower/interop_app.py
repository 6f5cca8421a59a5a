"""Flower's own side of the interoperability tests, written as Flower's quickstarts write it.

``plain_client``: a ClientApp with no fedforge inside; it trains a torch logistic regression
(named like fedforge's ``logreg``: ``linear.weight``, ``linear.bias``) on data of its own and
replies an ``ArrayRecord`` + ``MetricRecord`` with ``num-examples``. ``flower_server``: a
ServerApp running Flower's ``FedAvg`` strategy (Message API), whose initial model is
fedforge's for the run config's ``fedforge-config``. The deployment test copies this file
into its app directory; the in-process tests import it.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from torch import nn

FEATURES, CLASSES = 60, 10  # the quickstart config's synthetic data


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def load_data(partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition ``i`` holds ``40 + 20 i`` samples (sizes differ, so weights matter)."""
    g = torch.Generator().manual_seed(1000 + partition_id)
    n = 40 + 20 * partition_id
    return torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


plain_client = ClientApp()


@plain_client.train()
def train(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(int(context.node_config["partition-id"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for start in range(0, len(x), 16):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[start:start + 16]), y[start:start + 16])
        loss.backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train_loss": loss.item(),
                                                   "num-examples": len(x)})})
    return Message(content=content, reply_to=msg)


flower_server = ServerApp()


@flower_server.main()
def main(grid: Grid, context: Context) -> None:
    from safetensors.torch import save_file

    from fedforge.flower.app import config_from_run
    from fedforge.flower.common import experiment

    cfg = config_from_run(context.run_config)
    nodes = int(context.run_config.get("num-nodes", 2))
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes,
                      min_available_nodes=nodes)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(
        experiment(cfg)[0].initial_params()), num_rounds=cfg.rounds, timeout=600)
    save_file({k: v.contiguous() for k, v in result.arrays.to_torch_state_dict().items()},
              str(context.run_config["fedforge-out"]))
