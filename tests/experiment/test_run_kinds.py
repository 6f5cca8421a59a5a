"""The two kinds of run: a schema each, sharing their sections, picked by ``tasks``.

A key of the other kind, or a shared section's key this kind does not read, is refused in
one line naming it; the multi-task defaults (``[async]``, ``[sync]``, a task's ``client``)
come from the one defaults table; config.resolved.toml keeps the layout earlier releases
wrote, so a run folder's file is unchanged.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import tomllib
from pydantic import TypeAdapter

from fedforge.algorithms.defaults import METHOD_DEFAULTS, ours
from fedforge.experiment.config import (
    RUN_KINDS,
    AsyncSection,
    BaseRunConfig,
    ClientConfig,
    ConfigError,
    EvalConfig,
    MultiTaskConfig,
    RunConfig,
    SingleTaskConfig,
    SyncSection,
    TaskConfig,
    dump_config,
    load_config,
    load_raw,
    method_option,
    run_kind,
    task_client_defaults,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
SECTIONS = {"async": AsyncSection, "sync": SyncSection}


def _keys(model: type[BaseRunConfig]) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}


def test_the_union_picks_the_kind_from_tasks():
    adapter = TypeAdapter(RunConfig)
    single, multi = adapter.validate_python({}), adapter.validate_python({"tasks": [{}]})
    assert type(single) is SingleTaskConfig and not single.multitask
    assert type(multi) is MultiTaskConfig and multi.multitask
    assert type(validate({})) is SingleTaskConfig and type(validate({"tasks": [{}]})) is (
        MultiTaskConfig)
    assert run_kind({"tasks": []}) == "multi" and run_kind({"rounds": 3}) == "single"
    with pytest.raises(ConfigError, match=r"^tasks: List should have at least 1 item"):
        validate({"tasks": []})


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_as_the_kind_the_union_picks(path):
    cfg = load_config(path)
    assert cfg == TypeAdapter(RunConfig).validate_python(load_raw(path))
    assert type(cfg) is RUN_KINDS[run_kind(load_raw(path))]


def test_both_kinds_share_their_sections_and_one_client_class():
    shared = set(BaseRunConfig.model_fields)
    assert {"name", "seed", "eval", "engine", "checkpoint", "plugins"} <= shared
    assert shared == set(SingleTaskConfig.model_fields) & set(MultiTaskConfig.model_fields)
    client = SingleTaskConfig.model_fields["client"].annotation
    assert TaskConfig.model_fields["client"].annotation is client


@pytest.mark.parametrize("key", sorted(_keys(MultiTaskConfig) - _keys(SingleTaskConfig)
                                       - {"tasks"}))
def test_a_multitask_key_in_a_single_task_run_is_refused(key):
    with pytest.raises(ConfigError, match=rf"^{key}: only a multi-task run reads it; add a "
                                          r"\[\[tasks\]\] list"):
        validate({"rounds": 2, key: {}})


@pytest.mark.parametrize("key", sorted(_keys(SingleTaskConfig) - _keys(MultiTaskConfig)))
def test_a_single_task_key_in_a_multitask_run_is_refused(key):
    where = (rf"set it per task \(tasks\[\]\.{key}\)" if key in TaskConfig.model_fields
             else "drop it")
    with pytest.raises(ConfigError, match=rf"^{key}: a multi-task run \(\[\[tasks\]\]\) does "
                                          rf"not read it; {where}$"):
        validate({"tasks": [{}], key: {}})


# a value other than the default for every key a kind's shared sections do not read
UNREAD_VALUES = {"max_test_samples": 5, "drop_last": True, "every": 2, "per_client": False,
                 "local_epochs": 2, "lr": 0.1, "weight_decay": 0.1, "max_grad_norm": 1.0,
                 "nar": True}


def _set(raw: dict, key: str, value: object) -> dict:
    *within, section, name = key.split(".")
    owner = raw["tasks"][0] if within == ["tasks[]"] else raw
    owner.setdefault(section, {})[name] = value
    return raw


@pytest.mark.parametrize("kind, key", [(k, key) for k in (SingleTaskConfig, MultiTaskConfig)
                                       for key in k.unread])
def test_a_shared_key_this_kind_does_not_read_is_refused(kind, key):
    def raw() -> dict:
        return {"tasks": [{}]} if kind.multitask else {}

    *_, section, name = key.split(".")
    shown = re.escape(key.replace("tasks[]", "tasks[0]"))
    with pytest.raises(ConfigError, match=rf"^{shown}: {re.escape(kind.unread[key])}$"):
        validate(_set(raw(), key, UNREAD_VALUES[name]))
    default = {"eval": EvalConfig, "client": ClientConfig}[section].model_fields[name].default
    validate(_set(raw(), key, default))  # the default is no setting


def test_single_task_resolved_config_keeps_the_earlier_layout(tmp_path):
    """Scalars first (tomli_w), each group in the order earlier releases wrote; no key of a
    multi-task run, no key the run does not read."""
    dump_config(validate({}), tmp_path / "c.toml")
    text = (tmp_path / "c.toml").read_text()
    assert text.startswith('name = "run"\nseed = 0\nrounds = 10\ndivergence = "stop"\n'
                           "rollback_lr_factor = 0.5\nmax_rollbacks = 3\nplugins = []\n\n"
                           "[data]\n")
    tables = re.findall(r"^\[(\w+)\]$", text, re.M)
    assert tables == ["data", "model", "algorithm", "client", "server", "eval", "engine",
                      "checkpoint", "attack", "sim", "logging", "privacy", "compare"]
    saved = tomllib.loads(text)
    assert "drop_last" not in saved["client"] and "max_test_samples" not in saved["eval"]
    assert saved["client"]["local_epochs"] == 1
    assert load_config(tmp_path / "c.toml") == validate({})
    assert set(SingleTaskConfig.key_order) == set(SingleTaskConfig.model_fields)


def test_multitask_resolved_config_has_only_what_it_reads(tmp_path):
    cfg = validate({"tasks": [{"client": {"batch_size": 8}}], "max_updates": 10})
    dump_config(cfg, tmp_path / "m.toml")
    saved = tomllib.loads((tmp_path / "m.toml").read_text())
    assert set(saved) == {"name", "seed", "eval", "engine", "checkpoint", "plugins", "tasks",
                          "system", "async", "sync", "max_updates"}
    assert saved["tasks"][0]["client"] == {"batch_size": 8, "local_steps": 27,
                                           "drop_last": False}
    assert "every" not in saved["eval"] and "per_client" not in saved["eval"]
    assert load_config(tmp_path / "m.toml") == cfg


# --- the multi-task defaults come from the one table ----------------------------------------


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_section_defaults_are_read_from_the_methods_table(section):
    """Each field of [async]/[sync] is written ``method_option("<section>.<field>")``: the
    value lives in fedforge.algorithms.defaults only, with its source."""
    model = SECTIONS[section]
    tree = ast.parse(inspect.getsource(model))
    fields = [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)]
    assert [f.target.id for f in fields] == list(model.model_fields)
    for f in fields:
        calls = [c for c in ast.walk(f.value) if isinstance(c, ast.Call)
                 and getattr(c.func, "id", "") == "method_option"]
        assert [ast.literal_eval(c.args[0]) for c in calls] == [f"{section}.{f.target.id}"], (
            f"{section}.{f.target.id}: write its default in fedforge.algorithms.defaults")
    for name, field in model.model_fields.items():
        listed = [t[f"{section}.{name}"].value for t in METHOD_DEFAULTS.values()
                  if f"{section}.{name}" in t]
        assert listed and all(v == field.default and type(v) is type(field.default)
                              for v in listed), name


def test_every_table_option_is_a_section_field():
    for method, table in METHOD_DEFAULTS.items():
        for key in table:
            section, name = key.split(".")
            fields = (ClientConfig if section == "client" else SECTIONS[section]).model_fields
            assert name in fields, f"{method}: {key}"


def test_method_option_refuses_disagreeing_methods(monkeypatch):
    monkeypatch.setitem(METHOD_DEFAULTS, "fedbuff", {
        **METHOD_DEFAULTS["fedbuff"], "async.requests": ours(5, "a test value, disagreeing")})
    with pytest.raises(TypeError, match=r"async.requests: expected one default .* \['5', '96'\]"):
        method_option("async.requests")
    with pytest.raises(TypeError, match="no method lists it"):
        method_option("async.nosuch")


def test_a_task_leaves_its_client_to_the_method(monkeypatch):
    """FedAST's tasks train batches of 32 for 27 steps unless a task says otherwise; one
    client class with one set of defaults (a single-task run: 10, one epoch)."""
    cfg = validate({"tasks": [{}, {"client": {"batch_size": 5, "drop_last": True}}]})
    first, second = cfg.tasks[0].client, cfg.tasks[1].client
    assert (first.batch_size, first.local_steps, first.local_epochs) == (32, 27, None)
    assert {m: task_client_defaults(m) for m in METHOD_DEFAULTS} == dict.fromkeys(
        METHOD_DEFAULTS, {"batch_size": 32, "local_steps": 27})
    assert (second.batch_size, second.local_steps, second.drop_last) == (5, 27, True)
    assert MultiTaskConfig(tasks=[TaskConfig()]).tasks[0].client.local_steps == 27
    single = validate({}).client
    assert (single.batch_size, single.local_steps, single.local_epochs) == (10, None, 1)
    # a method's own table entry wins over the shared one
    monkeypatch.setitem(METHOD_DEFAULTS, "sync_st", {
        **METHOD_DEFAULTS["sync_st"], "client.batch_size": ours(16, "a test value for sync")})
    assert validate({"method": "sync_st", "tasks": [{}]}).tasks[0].client.batch_size == 16
    assert validate({"method": "fedbuff", "tasks": [{}]}).tasks[0].client.batch_size == 32
