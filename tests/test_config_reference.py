"""The config reference is generated from the schema and kept in sync with it.

docs/config.md must equal ``fedforge config --markdown`` (regenerate it with that command);
``fedforge config --defaults`` must be a valid config whose values are the schema's
defaults; ``fedforge run --variant X`` must run what ``fedforge compare -a X`` runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge.algorithms import algorithm_hparams
from fedforge.cli import app
from fedforge.experiment.config import SingleTaskConfig, validate
from fedforge.study import reference

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "config.md"


def test_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == reference.markdown(), (
        "docs/config.md is stale: run `fedforge config --markdown > docs/config.md`")


CORE = ("data", "model", "algorithm", "client", "server", "eval", "engine", "checkpoint",
        "attack", "sim", "tasks[]")


def test_every_core_key_is_documented():
    """The keys a first run meets; a section's own docstring and comments describe the rest."""
    keys = reference.keys() + reference.keys(reference.schema.TaskConfig, "tasks[].")
    core = [k for k in keys if "." not in k.path or k.path.split(".")[0] in CORE]
    undocumented = [k.path for k in core if not k.description]
    assert not undocumented, f"give these a comment in config.py or a NOTES entry: {undocumented}"
    text = PAGE.read_text(encoding="utf-8")
    for key in ("`client.local_steps`", "`data.root`", "`plugins`", "`server.aggregation`"):
        assert key in text
    for topic in ("**Schedules.**", "**Dotted overrides.**", "**`null`.**",
                  "**`[compare.X]` tables.**", "--variant"):
        assert topic in text


def test_defaults_are_a_valid_config_of_the_schema_defaults():
    result = CliRunner().invoke(app, ["config", "--defaults"])
    assert result.exit_code == 0, result.output
    parsed = tomllib.loads(result.output)
    cfg = validate(parsed)
    assert cfg == validate(SingleTaskConfig().model_dump(by_alias=True, exclude_none=True))
    assert parsed["client"]["batch_size"] == 10 and parsed["server"]["clients_per_round"] == 10
    assert "# local_steps = null  # int | null; local steps per round" in result.output


def test_defaults_of_an_algorithm_with_their_sources():
    result = CliRunner().invoke(app, ["config", "--defaults", "fadamgc"])
    assert result.exit_code == 0, result.output
    algo = tomllib.loads(result.output)["algorithm"]
    assert algo == {"name": "fadamgc", **algorithm_hparams("fadamgc")}
    assert "local_lr = 0.001  # paper: Chen et al. (FAdamGC), App. H Table 4" in result.output
    bad = CliRunner().invoke(app, ["config", "--defaults", "fedavgg"])
    assert bad.exit_code == 2 and "ALGORITHM: unknown algorithm 'fedavgg'" in bad.output


def test_run_variant_applies_the_compare_table(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text((ROOT / "examples" / "quickstart.toml").read_text()
                      + "\n[compare.fedprox.algorithm]\nmu = 0.25\nlocal_lr = 0.02\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(config), "--variant", "fedprox", "rounds=1",
                                      "algorithm.local_lr=0.03", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    algo = tomllib.loads((out / "config.resolved.toml").read_text())["algorithm"]
    # the table over the file, then the command line over the table
    assert (algo["name"], algo["mu"], algo["local_lr"]) == ("fedprox", 0.25, 0.03)
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["round"] == 1
    bad = CliRunner().invoke(app, ["run", str(config), "--variant", "scaffold", "--out",
                                   str(tmp_path / "bad")])
    assert bad.exit_code == 2
    assert "--variant: no [compare.scaffold] table" in bad.output
    assert "tables: ['fedprox']" in bad.output


@pytest.mark.parametrize("value, shown", [(None, "null"), (True, "true"), ("a", '"a"'),
                                          ([1, 2.5], "[1, 2.5]"), ({"k": 1}, "{k = 1}")])
def test_show(value, shown):
    assert reference.show(value) == shown
