"""A cohort larger than the client population is an error naming the field, not a silent cut."""

from pathlib import Path

import pytest

from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment

QUICK = Path(__file__).resolve().parents[2] / "examples/quickstart.toml"


def test_more_clients_per_round_than_clients_is_an_error():
    cfg = load_config(QUICK, ["server.clients_per_round=500"])
    with pytest.raises(ValueError, match=r"^server.clients_per_round: 500 is more than the 30 "):
        Experiment.from_config(cfg)
