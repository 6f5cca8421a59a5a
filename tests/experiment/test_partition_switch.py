"""``data.partition=...`` on the command line: the old partition's options that the new one
does not take are dropped (not carried into a refusal), shared ones carry over, and the
options given with the switch are kept and checked."""

from __future__ import annotations

import pytest

from fedforge.experiment.config import ConfigError, load_config
from fedforge.study.compare import comparison_configs

DIRICHLET = "examples/mnist_dirichlet.toml"  # partition_options = {alpha = 0.1, min_size = 10}


def _options(*overrides: str) -> dict:
    return load_config(DIRICHLET, list(overrides)).data.partition_options


def test_switching_to_a_partition_without_options_drops_them():
    assert _options("data.partition=iid") == {}


def test_shared_options_carry_over_and_the_rest_is_dropped():
    assert _options("data.partition=dirichlet_equal") == {"alpha": 0.1}


def test_options_given_with_the_switch_are_kept_and_checked():
    assert _options("data.partition=shards",
                    "data.partition_options.classes_per_client=2") == {"classes_per_client": 2}
    with pytest.raises(ConfigError, match="data.partition_options.alpha: unknown option"):
        _options("data.partition=shards", "data.partition_options.alpha=0.3")


def test_the_file_keeps_its_options_when_the_partition_stays():
    assert _options("data.partition=dirichlet") == {"alpha": 0.1, "min_size": 10}


def test_compare_switches_the_same_way():
    cfgs = comparison_configs(DIRICHLET, ["fedavg"], ["data.partition=iid"])
    assert cfgs["fedavg"][0].data.partition_options == {}
