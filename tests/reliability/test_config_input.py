"""Hostile and careless config input: files that would hang or crash a naive parser,
overrides that a YAML 1.1 reader would silently misread, mistyped option tables, damaged
metrics files. Every outcome is a config or a one-line error naming the file or field."""

from __future__ import annotations

import json
import logging
import os
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from fedforge.algorithms import algorithm_hparams
from fedforge.core.config_io import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_VALUES
from fedforge.data import DatasetError, load_dataset
from fedforge.experiment.config import (
    BaseRunConfig,
    ConfigError,
    MultiTaskConfig,
    SingleTaskConfig,
    apply_overrides,
    load_config,
)

from .test_hostile_config import FIELD  # one-line messages naming the field or file

BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9 if prev else ['lol'] * 9)}]\n"
    for prev, name in zip([None, *"abcdefgh"], "abcdefghi", strict=True))


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _refused(call, *patterns: str) -> str:
    """``call()`` raises a one-line ConfigError matching every pattern; returns the message."""
    with pytest.raises(ConfigError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg and FIELD.match(msg), msg
    for p in patterns:
        assert re.search(p, msg), (p, msg)
    return msg


# --- files: size, depth, aliases, encoding ---------------------------------------------------


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    path = _write(tmp_path, "bomb.yaml", BOMB)
    assert len(BOMB.encode()) < 400  # ~10^9 strings once expanded
    tracemalloc.start()  # at once: before the aliases are expanded (memory, not a clock)
    try:
        _refused(lambda: load_config(path),
                 re.escape(f"{path}: more than {MAX_VALUES} values"), "aliases")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20


def test_moderate_yaml_aliases_still_work(tmp_path):
    text = ("data: {dataset: synthetic, options: &opts {alpha: 0.5, num_clients: 5}}\n"
            "compare: {fedprox: {data: {options: *opts}}}\n"
            "eval: &ev {every: 2}\ncheckpoint:\n  <<: *ev\n  keep: 3\n")
    cfg = load_config(_write(tmp_path, "ok.yaml", text))
    assert cfg.data.options == {"alpha": 0.5, "num_clients": 5}
    assert cfg.compare["fedprox"]["data"]["options"] == cfg.data.options
    assert (cfg.checkpoint.every, cfg.checkpoint.keep) == (2, 3)


@pytest.mark.parametrize("text", ["data: &a {options: *a}\n", "a: &x [1, *x]\n",
                                  "&r {rounds: *r}\n"])
def test_recursive_yaml_alias_is_refused(tmp_path, text):
    path = _write(tmp_path, "rec.yaml", text)
    _refused(lambda: load_config(path), re.escape(f"{path}: YAML alias"), "its own anchor")


@pytest.mark.parametrize(("name", "text"), [
    ("deep.yaml", "[" * 100_000 + "]" * 100_000),
    ("deep.yaml", "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200))),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000),
    ("deep.toml", "a = " + "{b = " * 5_000 + "1" + "}" * 5_000),
    ("deep.toml", "[" + ".".join(["t"] * (MAX_DEPTH + 1)) + "]\nx = 1\n"),
])
def test_deep_nesting_is_refused(tmp_path, name, text):
    path = _write(tmp_path, name, text)
    _refused(lambda: load_config(path), re.escape(f"{path}: ") + f"([\\w.]+: )?nested deeper than "
             f"{MAX_DEPTH}")


def test_nesting_below_the_limit_is_fine(tmp_path):
    schedule = '{schedule = "warmup", init = 0.1, rounds = 2, then = ' * 3 + "0.1" + "}" * 3
    path = _write(tmp_path, "ok.toml", f'[algorithm]\nname = "fedavg"\nlocal_lr = {schedule}\n')
    assert load_config(path).algorithm.hparams["local_lr"]["schedule"] == "warmup"


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_non_utf8_bytes_are_refused(tmp_path, suffix):
    path = _write(tmp_path, "c" + suffix, b'name = "caf\xe9"\n' if suffix == ".toml"
                  else b"name: caf\xe9\n")
    _refused(lambda: load_config(path), re.escape(str(path)), "not UTF-8", "0xe9", "offset")


def test_byte_order_mark_is_accepted(tmp_path):
    path = _write(tmp_path, "c.toml", "\ufeffrounds = 3\n".encode())
    assert load_config(path).rounds == 3


def test_oversized_file_is_refused_without_reading_it_all(tmp_path):
    path = _write(tmp_path, "big.toml", "# " + "x" * MAX_CONFIG_BYTES + "\nrounds = 3\n")
    _refused(lambda: load_config(path), re.escape(str(path)), f"larger than {MAX_CONFIG_BYTES}")


def test_too_many_values_are_refused(tmp_path):
    path = _write(tmp_path, "wide.toml", "[data.options]\nx = [" + "1," * MAX_VALUES + "]\n")
    _refused(lambda: load_config(path), f"more than {MAX_VALUES} values")


def test_directory_and_fifo_are_not_read(tmp_path):
    _refused(lambda: load_config(tmp_path), "not a regular file")
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)  # reading it would block forever
    _refused(lambda: load_config(fifo), "not a regular file")
    _refused(lambda: load_config(tmp_path / "absent.toml"), "not found")


@pytest.mark.parametrize(("name", "text", "pattern"), [
    ("d.toml", "name = 2020-01-01\n", r"name: a date is not a config value"),
    ("d.yaml", "data: {options: {x: !!binary aGVsbG8=}}\n", "tag .*binary is not allowed"),
    ("d.yaml", "data: {options: !!set {a, b}}\n", "tag .*set is not allowed"),
    ("d.yaml", "name: !!timestamp 2020-01-01\n", "tag .*timestamp is not allowed"),
    ("d.yaml", "rounds: !!int ''\n", "invalid YAML value"),
    ("d.yaml", "rounds: !!float ''\n", "invalid YAML value"),
    ("d.yaml", "rounds: !!bool maybe\n", "invalid YAML value"),
    ("d.yaml", "{[1, 2]: 3}\n", "invalid YAML"),
    ("d.yaml", "1: 2\n", r"key 1 is not a string"),
    ("d.yaml", "!!python/object/apply:os.system [echo hi]\n", "invalid YAML"),
    ("d.yaml", "a: 1\n---\nb: 2\n", "invalid YAML"),
    ("d.toml", "a = [1,\n", "invalid TOML"),
    ("d.yaml", "- 1\n- 2\n", "a table of sections"),
])
def test_non_plain_yaml_and_toml_values_are_refused(tmp_path, name, text, pattern):
    path = _write(tmp_path, name, text)
    _refused(lambda: load_config(path), re.escape(str(path)), pattern)


def test_yaml_dates_stay_strings(tmp_path):
    path = _write(tmp_path, "c.yaml", "name: 2020-01-01\n")
    assert load_config(path).name == "2020-01-01"


# --- strict types: files and overrides --------------------------------------------------------


@pytest.mark.parametrize(("override", "pattern"), [
    ("rounds=1:30", r"^rounds: .*integer.*'1:30'"),  # YAML 1.1: sexagesimal 90
    ("client.batch_size=yes", r"^client\.batch_size: .*integer.*'yes'"),  # YAML 1.1: True -> 1
    ("rounds=true", r"^rounds: .*integer.*True"),
    ("rounds=2.0", r"^rounds: .*integer.*2\.0"),
    ("rounds=010", r"^rounds: .*integer.*'010'"),  # YAML 1.1: octal 8
    ("eval.per_client=yes", r"^eval\.per_client: .*boolean.*'yes'"),
    ("eval.per_client=1", r"^eval\.per_client: .*boolean.*1"),
    ("attack.fraction=off", r"^attack\.fraction: .*number.*'off'"),
    ("rollback_lr_factor=nan", r"^rollback_lr_factor: .*finite"),
    ("attack.scale=-inf", r"^attack\.scale: .*finite"),
    ("engine.chunk_size=true", r"^engine\.chunk_size: "),
    ("sim.speed_classes=[[0.5, 1.0], [0.5, yes]]", r"^sim\.speed_classes\[1\]\[1\]: "),
])
def test_overrides_are_typed_by_the_schema(tmp_path, override, pattern):
    path = _write(tmp_path, "c.toml", "rounds = 2\n")
    _refused(lambda: load_config(path, [override]), pattern)


@pytest.mark.parametrize(("name", "text", "pattern"), [
    ("c.toml", "rounds = true\n", r"^rounds: .*integer"),
    ("c.toml", "rounds = 3.0\n", r"^rounds: .*integer"),
    ("c.toml", "[eval]\nper_client = 1\n", r"^eval\.per_client: .*boolean"),
    ("c.toml", 'seed = "3"\n', r"^seed: .*integer"),
    ("c.toml", "[attack]\nscale = nan\n", r"^attack\.scale: .*finite"),
    ("c.yaml", "rounds: 1:30\n", r"^rounds: .*'1:30'"),
    ("c.yaml", "eval: {per_client: yes}\n", r"^eval\.per_client: .*'yes'"),
    ("c.yaml", "client: {batch_size: on}\n", r"^client\.batch_size: .*'on'"),
    ("c.yaml", "seed: 010\n", r"^seed: .*'010'"),
])
def test_file_values_are_typed_strictly(tmp_path, name, text, pattern):
    path = _write(tmp_path, name, text)
    _refused(lambda: load_config(path), pattern)


def test_legitimate_overrides_still_work(tmp_path):
    path = _write(tmp_path, "c.toml", '[client]\nlr = {schedule = "exponential", init = 0.1, '
                  "gamma = 0.99}\n")
    cfg = load_config(path, [
        "rounds=7", "seed=-3", "name=2024", "data.root=null", "eval.per_client=false",
        "attack.fraction=0.25", "attack.scale=2", "algorithm.server_lr=1e-3",
        "client.lr.gamma=0.5", "engine.chunk_size=auto", "engine.compile=true",
        "sim.speed_classes=[[0.5, 1.0], [0.5, 2]]", "model.name=mlp",
        "model.options={hidden: [8, 8]}", "data.options.alpha=0.5",
        "server.aggregator_options={}", "client.batch_size=0x10",
    ])
    assert (cfg.rounds, cfg.seed, cfg.name, cfg.data.root) == (7, -3, "2024", None)
    assert cfg.eval.per_client is False and cfg.attack.scale == 2.0
    assert cfg.algorithm.hparams["server_lr"] == 0.001 and cfg.client.lr["gamma"] == 0.5
    assert cfg.engine.compile is True and cfg.sim.speed_classes == [(0.5, 1.0), (0.5, 2.0)]
    assert cfg.model.options == {"hidden": [8, 8]} and cfg.client.batch_size == 16
    schedule = '{"schedule":"exponential","init":0.01,"gamma":0.996004}'
    cfg = load_config(path, [f"algorithm.local_lr={schedule}", "client.lr=null",
                             "name='quoted: text'"])
    assert cfg.algorithm.hparams["local_lr"]["gamma"] == 0.996004 and cfg.name == "quoted: text"


def test_string_fields_keep_the_override_text():
    out = apply_overrides({}, ["name=1:30", "data.dataset=[x]", "model.name= mlp ",
                               "data.root=~", "algorithm.name='quoted'"])
    assert out == {"name": "1:30", "data": {"dataset": "[x]", "root": None},
                   "model": {"name": "mlp"}, "algorithm": {"name": "quoted"}}


def test_override_limits_name_the_override():
    _refused(lambda: apply_overrides({}, ["rounds=" + "[" * 1000 + "]" * 1000]),
             r"^override 'rounds=\[+\.\.\.': nested deeper than " + str(MAX_DEPTH))
    _refused(lambda: apply_overrides({}, [".".join(["a"] * 40) + "=1"]), "deeper than")
    bomb = "{" + BOMB.replace("\n", ", ").rstrip(", ") + "}"
    _refused(lambda: apply_overrides({}, [f"data.options={bomb}"]), r"\.\.\.': more than")


# --- option tables ---------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "pattern"), [
    (["data.options.alpha=nan"], r"^data\.options\.alpha: .*finite"),
    (["data.options.alpha=abc"], r"^data\.options\.alpha: .*number.*'abc'"),
    (["data.options.num_clients=abc"], r"^data\.options\.num_clients: .*integer.*'abc'"),
    (["data.options.num_clients=true"], r"^data\.options\.num_clients: .*integer.*True"),
    (["data.options.iid=1"], r"^data\.options\.iid: .*boolean"),
    (["data.options.bogus=1"], r"^data\.options\.bogus: unknown option.*accepted: .*alpha"),
    (["data.options.root=/tmp"], r"^data\.options\.root: not an option.*data\.root"),
    (["model.name=mlp", "model.options.hidden=abc"], r"^model\.options\.hidden: .*'abc'"),
    (["model.name=mlp", "model.options.hidden=[8, x]"], r"^model\.options\.hidden\[1\]: "),
    (["model.name=mlp", "model.options.num_classes=3"], r"^model\.options\.num_classes: not"),
    (["model.name=cnn", "model.options.fc=1.5"], r"^model\.options\.fc: .*integer"),
    (["data.partition=dirichlet", "data.num_clients=4"],
     r"^data\.partition_options\.alpha: Field required"),
    (["data.partition=dirichlet", "data.num_clients=4", "data.partition_options.alpha=inf"],
     r"^data\.partition_options\.alpha: .*finite"),
    (["data.partition=iid", "data.num_clients=4", "data.partition_options.rng=1"],
     r"^data\.partition_options\.rng: not an option"),
    (["data.partition_options.alpha=1"], r"^data\.partition_options: partition 'natural'"),
])
def test_option_tables_are_typed(tmp_path, overrides, pattern):
    path = _write(tmp_path, "c.toml", "rounds = 2\n")
    _refused(lambda: load_config(path, overrides), pattern)


def test_valid_option_tables_pass(tmp_path):
    path = _write(tmp_path, "c.toml", "[data.options]\nalpha = 0\nnum_clients = 5\n"
                  "max_samples_per_client = 100\n[model]\nname = \"cnn\"\n"
                  "options = {channels = [4, 8], fc = 16}\n")
    cfg = load_config(path, ["data.partition=dirichlet", "data.num_clients=5",
                             "data.partition_options={alpha: 1, min_size: 2}"])
    assert cfg.data.options["alpha"] == 0 and cfg.model.options["channels"] == [4, 8]


# --- multi-task configs ----------------------------------------------------------------------

MULTI = """
method = "fedast"
[[tasks]]
data = {dataset = "synthetic"}
[[tasks]]
data = {dataset = "synthetic", options = {alpha = 0.5}}
"""


def test_multitask_bomb_and_recursion_are_refused(tmp_path):
    path = _write(tmp_path, "m.yaml", BOMB + "tasks: [{}]\n")
    _refused(lambda: load_config(path), "more than")
    path = _write(tmp_path, "r.yaml", "tasks: &t [{data: {options: *t}}]\n")
    _refused(lambda: load_config(path), "own anchor")


@pytest.mark.parametrize(("override", "pattern"), [
    ("tasks[1].data.options.alpha=nan", r"^tasks\[1\]\.data\.options\.alpha: .*finite"),
    ("tasks.0.data.options.num_clients=abc", r"^tasks\[0\]\.data\.options\.num_clients: "),
    ("tasks.client.batch_size=yes", r"^tasks\[0\]\.client\.batch_size: .*'yes'"),
    ("tasks[1].model.options.hidden=abc", r"^tasks\[1\]\.model\.options\.hidden: "),
    ("tasks[1].step_time=true", r"^tasks\[1\]\.step_time: .*number"),
    ("tasks[0].data=1", r"^tasks\[0\]\.data: "),
    ("tasks[0].data.x.y=1", r"^tasks\[0\]\.data\.x: "),
    ("tasks[1].data.dataset.x=1", r"^tasks\[1\]\.data\.dataset: is a value"),
    ("tasks[5].seed=1", r"^tasks\[5\]: no such task"),
    ("system.num_clients=1:30", r"^system\.num_clients: .*'1:30'"),
    ("async.requests=true", r"^async\.requests: .*integer"),
    ("max_time=nan", r"^max_time: .*finite"),
])
def test_multitask_overrides_are_typed(tmp_path, override, pattern):
    path = _write(tmp_path, "m.toml", MULTI)
    _refused(lambda: load_config(path, ["tasks.model.name=mlp", override]), pattern)


def test_multitask_file_values_are_strict(tmp_path):
    path = _write(tmp_path, "m.toml", MULTI.replace("alpha = 0.5", "alpha = true"))
    _refused(lambda: load_config(path), r"^tasks\[1\]\.data\.options\.alpha: ")
    path = _write(tmp_path, "m2.toml", "tasks = 3\n")
    _refused(lambda: load_config(path, ["tasks.0.name=x"]), r"^tasks: expected a list")
    cfg = load_config(_write(tmp_path, "m3.toml", MULTI), ["tasks[1].name=2024",
                                                              "async.requests=5"])
    assert cfg.tasks[1].name == "2024" and cfg.async_.requests == 5


# --- messages and the CLI ---------------------------------------------------------------------


def test_config_error_is_one_printable_line():
    msg = str(ConfigError("name: bad 'a\nb\r\x1b[31mred\u2028'"))
    assert msg.isprintable() and "\\n" in msg and "\\x1b" in msg


@pytest.mark.parametrize(("override", "shown"), [
    ("[/x]=1", "'[/x]'"), ("name2=[bold]x", "'[bold]x'"), ("data.dataset=[/red]", "'[/red]'")])
def test_cli_prints_markup_in_errors_literally(tmp_path, override, shown):
    from fedforge import cli

    path = _write(tmp_path, "c.toml", "rounds = 2\n")
    result = CliRunner().invoke(cli.app, ["run", str(path), override, "--out",
                                          str(tmp_path / "out"), "-q"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and shown in result.output, result.output


def _metrics(tmp_path: Path, lines: list[str]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return run


def test_plot_skips_a_half_written_last_line(tmp_path, caplog):
    from fedforge.study.plots import load_runs

    rec = [json.dumps({"round": r, "test_accuracy": r / 10}) for r in (1, 2)]
    run = _metrics(tmp_path, [*rec, '{"round": 3, "test_acc'])
    with caplog.at_level(logging.WARNING):
        runs = load_runs([run])
    assert [r["round"] for r in runs["run"]] == [1, 2]
    assert "incomplete last line 3" in caplog.text


def test_plot_cli_refuses_unknown_metric_and_damaged_file(tmp_path):
    from fedforge import cli

    rec = [json.dumps({"round": r, "test_accuracy": r / 10, "wall_s": 1.0}) for r in (1, 2)]
    run = _metrics(tmp_path, [*rec, '{"round": 3, "test_acc'])
    png = tmp_path / "p.png"
    ok = CliRunner().invoke(cli.app, ["plot", str(run), "-o", str(png)])
    assert ok.exit_code == 0 and png.stat().st_size > 0, ok.output
    bad = CliRunner().invoke(cli.app, ["plot", str(run), "-m", "test_acuracy", "-o",
                                       str(tmp_path / "q.png")])
    text = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "metric 'test_acuracy'" in text, bad.output
    assert "available: round, test_accuracy, wall_s" in text and "Traceback" not in text
    assert not (tmp_path / "q.png").exists()
    (run / "metrics.jsonl").write_text("{}\nnot json\n" + rec[0], encoding="utf-8")
    damaged = CliRunner().invoke(cli.app, ["plot", str(run), "-o", str(png)])
    assert damaged.exit_code == 2 and "line 2 is not a JSON record" in damaged.output


# --- FEMNIST labels --------------------------------------------------------------------------


def _femnist(tmp_path: Path, y_train: np.ndarray) -> Path:
    d = tmp_path / "femnist"
    d.mkdir(exist_ok=True)
    x, w = np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.int32)
    np.savez(d / "femnist_leaf_subset.npz", x_train=x, y_train=y_train, writer_train=w,
             x_test=x, y_test=np.array([0, 1], np.uint8), writer_test=w,
             writers=np.array(["f0"]))
    return d / "femnist_leaf_subset.npz"


@pytest.mark.parametrize("labels", [[0.0, 1.5], [0.0, np.nan], ["a", "b"]])
def test_femnist_non_integer_labels_are_refused(tmp_path, labels):
    path = _femnist(tmp_path, np.array(labels))
    with pytest.raises(DatasetError, match=re.escape(str(path)) + ".*y_train") as info:
        load_dataset("femnist", tmp_path)
    assert "\n" not in str(info.value)


def test_femnist_integral_float_labels_are_accepted(tmp_path):
    _femnist(tmp_path, np.array([3.0, 61.0]))
    assert load_dataset("femnist", tmp_path).train_y.tolist() == [3, 61]


# --- property tests: anything hypothesis can build --------------------------------------------


def _schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _schema_keys(ann, key + ".")
        else:
            keys.append(key)
    return keys


SCHEMA_KEYS = {*_schema_keys(SingleTaskConfig), *_schema_keys(MultiTaskConfig)}  # both kinds
RUN_KEYS = sorted({*SCHEMA_KEYS, *(f"algorithm.{k}" for k in algorithm_hparams("fedavg")),
                   "data.options.alpha", "data.options.num_clients", "data.options.iid",
                   "model.options.hidden", "data.partition_options.alpha"})
TASK_KEYS = sorted({*SCHEMA_KEYS, "tasks.data.options.alpha",
                    "tasks[0].client.batch_size", "tasks.1.model.options.hidden",
                    "tasks[1].step_time", "tasks.0.data.partition"})
VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "1", "-1", "2.5", "1e-3", "1e400", "nan", ".nan", "-inf", "true",
                     "yes", "off", "null", "~", "1:30", "010", "0x1f", "2020-01-01", "[1, 2]",
                     "[[0.5, 1], [0.5, 1]]", "{a: 1}", "{}", "[", "{", "&a [*a]", "*a",
                     "!!binary aGk=", "!!set {a}", "!!python/name:os.system", "'q'",
                     "{schedule: cosine, init: 0.1, rounds: 5}", "mlp", "dirichlet", "[8]"]),
)
FRAGMENTS = st.sampled_from([
    "&a ", "&b ", "*a", "*b", "<<: ", "[", "]", "{", "}", ", ", ": ", " = ", "\n", "  ", "- ",
    "rounds", "data", "options", "tasks", "[[tasks]]", "[data]", "alpha", "1", "1.5", "yes",
    "1:30", "true", "nan", "\"s\"", "'s'", "!!binary ", "!!set ", "!!timestamp ", "2020-01-01",
    "# c", "---", "...", "\t", "\x00", "\ufeff",
])
FILES = st.one_of(
    st.binary(max_size=300),
    st.lists(FRAGMENTS, max_size=40).map(lambda xs: "".join(xs).encode()),
    st.tuples(st.lists(FRAGMENTS, max_size=20), st.binary(max_size=8)).map(
        lambda t: "".join(t[0]).encode() + t[1]),
)
# a longer soak: FEDFORGE_HYPOTHESIS_EXAMPLES=5000 python3 -m pytest tests/reliability
PROPERTY = settings(max_examples=int(os.environ.get("FEDFORGE_HYPOTHESIS_EXAMPLES", 200)),
                    deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _outcome(call, kind: type) -> None:
    """The only allowed outcomes: a config of ``kind`` or a one-line ConfigError."""
    try:
        cfg = call()
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.isprintable() and FIELD.match(msg), msg
        return
    assert isinstance(cfg, kind)


@PROPERTY
@given(content=FILES, suffix=st.sampled_from([".toml", ".yaml", ".yml"]))
def test_any_bytes_as_a_config_file(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("cfg") / f"c{suffix}"
    path.write_bytes(content)
    _outcome(lambda: load_config(path), BaseRunConfig)


@PROPERTY
@given(items=st.lists(st.tuples(st.sampled_from(RUN_KEYS), VALUES), max_size=4))
def test_any_override_values_over_the_real_keys(tmp_path_factory, items):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_text("rounds = 2\n")
    _outcome(lambda: load_config(path, [f"{k}={v}" for k, v in items]), BaseRunConfig)


@PROPERTY
@given(items=st.lists(st.tuples(st.sampled_from(TASK_KEYS), VALUES), max_size=4))
def test_any_multitask_override_values(tmp_path_factory, items):
    path = tmp_path_factory.mktemp("cfg") / "m.toml"
    path.write_text(MULTI)
    _outcome(lambda: load_config(path, [f"{k}={v}" for k, v in items]), BaseRunConfig)
