"""What the Flower client and server sides share: record keys, the cached experiment and the
tensor <-> ``ArrayRecord`` conversions."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import torch

from fedforge.core.tree import flatten_dict, unflatten_dict
from fedforge.engine import classification_loss
from fedforge.engine.loop import LoopEngine
from fedforge.errors import ConfigError
from fedforge.experiment.config import RunConfig
from fedforge.experiment.population_checks import refuse_population
from fedforge.experiment.runner import Experiment

try:
    from flwr.app import ArrayRecord
except ImportError as e:  # pragma: no cover - optional extra
    raise ImportError(
        "fedforge.flower needs the Flower extra: pip install 'fedforge[flower]'") from e

logger = logging.getLogger("fedforge.flower")
STATE_KEY = "fedforge-client-state"  # the ArrayRecord in context.state holding c_i, y_i, ...
NUM_EXAMPLES = "num-examples"  # Flower's standard weighting key in a reply's MetricRecord
SERVER_ROUND = "server-round"  # Flower's strategies put the round here in the ConfigRecord
_EXPERIMENTS: dict[str, tuple[Experiment, Callable]] = {}  # per-process cache, by config


def experiment(cfg: RunConfig) -> tuple[Experiment, Callable]:
    """Build (once per process) the experiment: the same data, partition and model as a run."""
    key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, default=str)
    if key not in _EXPERIMENTS:
        refuse_population(cfg.data.dataset, "the Flower bridge")
        if cfg.server.sampler != "uniform":  # its strategies sample the nodes themselves
            raise ConfigError(f"server.sampler: the Flower bridge samples nodes uniformly; "
                              f"run {cfg.server.sampler!r} with `fedforge run`")
        exp = Experiment.from_config(cfg)
        exp.engine = LoopEngine()  # one client per call: the reference engine
        _EXPERIMENTS[key] = (exp, classification_loss(exp.network, cfg.engine.precision))
    return _EXPERIMENTS[key]


def to_record(tree: dict) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in flatten_dict(tree).items()})


def from_record(rec: ArrayRecord, device: torch.device) -> dict:
    return unflatten_dict({k: v.to(device) for k, v in rec.to_torch_state_dict().items()})


def standard_message_support(exp: Experiment) -> str | None:
    """Why ``exp``'s algorithm cannot run on Flower's standard messages (model in, model out),
    or None when it can: the FedAvg family, whose clients run plain local training (no
    stateful parts such as SCAFFOLD's control variates, no uplink codec)."""
    alg = exp.algorithm
    if alg.parts or alg.codec is not None:
        what = "uplink codec" if alg.codec is not None else f"parts {[p.name for p in alg.parts]}"
        return (f"algorithm {exp.cfg.algorithm.name!r} needs fedforge's own protocol (its "
                f"{what}); Flower's standard messages carry only the model")
    return None
