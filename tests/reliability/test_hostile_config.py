"""Property tests: any config file or dotted override gives a RunConfig or a one-line
ConfigError that names the field — never another exception or a traceback."""

from __future__ import annotations

import os
import re

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedforge.experiment.config import (
    BaseRunConfig,
    ConfigError,
    apply_overrides,
    load_config,
)

SECTIONS = {
    "": ["name", "seed", "rounds", "divergence", "rollback_lr_factor", "max_rollbacks"],
    "data": ["dataset", "root", "partition", "num_clients", "options", "partition_options"],
    "model": ["name", "options"],
    "algorithm": ["name", "local_lr", "server_lr", "mu", "client_optimizer", "bogus"],
    "client": ["batch_size", "local_steps", "local_epochs", "lr"],
    "server": ["clients_per_round", "aggregation", "aggregator", "aggregator_options"],
    "eval": ["every", "batch_size", "per_client"],
    "engine": ["name", "chunk_size", "device", "precision"],
    "checkpoint": ["every", "keep"],
    "attack": ["kind", "fraction", "scale", "noise_std"],
}
KNOWN_KEYS = [f"{s}.{k}" if s else k for s, ks in SECTIONS.items() for k in ks]
# "<field path>: <message>", or "override '<item>': ..." / "config file <path>: ..."; list
# items are indexed: "sim.speed_classes[1][0]: ..."
_PART = r"""(?:[\w\-]+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?:\[\d*\])*"""
FIELD = re.compile(rf"^(override {_PART}|config file .+?|{_PART}(?:\.{_PART})*): \S")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["fedavg", "scaffold", "median", "krum", "iid", "mnist", "logreg", "auto",
                     "cpu", "stop", "rollback", "sign_flip", "-1", "0", "1e9", "nan"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
override_value = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["0", "-3", "0.5", "1e400", "nan", "inf", "true", "[1, 2]", "{a: 1}",
                     "{kind: cosine}", "null", "'quoted'", "[", "{", ": :", "2020-01-01",
                     "fedavg", "median", "krum", "trimmed_mean", "label_flip", "rollback"]),
)
override_key = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=15),
                         st.sampled_from(KNOWN_KEYS).map(lambda k: k + ".sub"))
overrides = st.lists(st.one_of(
    st.tuples(override_key, override_value).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=15)), max_size=4)


def _check(call) -> None:
    try:
        cfg = call()
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and FIELD.match(msg), msg
        return
    assert isinstance(cfg, BaseRunConfig)


def _doc():
    section = st.sampled_from([s for s in SECTIONS if s])
    body = st.dictionaries(
        st.one_of(st.sampled_from(sum(SECTIONS.values(), [])), st.text(max_size=8)),
        values, max_size=4)
    top = st.dictionaries(st.one_of(section, st.sampled_from(SECTIONS[""]), st.text(max_size=6)),
                          st.one_of(body, values), max_size=5)
    return top


# more examples for a soak: FEDFORGE_HYPOTHESIS_EXAMPLES=5000 python3 -m pytest tests/reliability
EXAMPLES = int(os.environ.get("FEDFORGE_HYPOTHESIS_EXAMPLES", 150))
FAST = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FAST
@given(ov=overrides)
def test_any_overrides_valid_or_one_line_error(tmp_path_factory, ov):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text('[algorithm]\nname = "fedavg"\n')
    _check(lambda: load_config(path, ov))


@FAST
@given(doc=_doc())
def test_any_toml_document_valid_or_one_line_error(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    try:
        path.write_text(tomli_w.dumps(doc))
    except (TypeError, ValueError):  # None / NaN keys tomli_w cannot write: try YAML
        import yaml

        path = path.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(doc))
    _check(lambda: load_config(path))


@FAST
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1"))), suffix=st.sampled_from([".toml", ".yaml", ".yml", ".json"]))
def test_any_file_bytes_valid_or_one_line_error(tmp_path_factory, text, suffix):
    path = tmp_path_factory.mktemp("cfg") / f"c{suffix}"
    path.write_text(text, encoding="utf-8")
    _check(lambda: load_config(path))


def test_override_of_a_value_with_a_section_names_it():
    with pytest.raises(ConfigError, match=r"^rounds: is a value"):
        apply_overrides({"rounds": 3}, ["rounds.x=1"])


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ov=overrides)
def test_cli_never_prints_a_traceback(tmp_path_factory, monkeypatch, ov):
    from fedforge import cli
    from fedforge.experiment import runner

    monkeypatch.setattr(runner, "run_experiment", lambda *a, **k: [])  # validate only
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text('[algorithm]\nname = "fedavg"\n')
    out = tmp_path_factory.mktemp("out")
    result = CliRunner().invoke(cli.app, ["run", str(path), *ov, "--out", str(out), "-q"])
    assert result.exit_code in (0, 2), (ov, result.output, result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2 and "error:" in result.output:
        line = result.output.split("error:", 1)[1].strip()
        assert FIELD.match(line), line


def test_exponent_floats_parse_as_numbers():
    """YAML 1.1 would read ``1e-3`` as a string; overrides read it as the number."""
    out = apply_overrides({}, ["algorithm.local_lr=1e-3", "a=2E5", "b=1e", "c=x1e3"])
    assert out == {"algorithm": {"local_lr": 0.001}, "a": 200000.0, "b": "1e", "c": "x1e3"}
