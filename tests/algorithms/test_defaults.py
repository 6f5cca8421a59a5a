"""Every default is written once, with its source, in ``fedforge.algorithms.defaults``.

The built-in factories carry no default of their own: ``defaults_from`` gives them the
table's, so a changed default (β2 0.99 -> 0.999, τ 1e-3 -> 1e-8, ...) is a changed table
entry, with its stated source. A new algorithm, hyper-parameter or multi-task method without
a table entry fails here, and so does a default written in a factory's signature as well.
"""

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforge.algorithms import (
    ALGORITHMS,
    ALIASES,
    algorithm_hparams,
    build_algorithm,
    resolved_hparams,
)
from fedforge.algorithms.defaults import (
    ALGORITHM_DEFAULTS,
    CODE,
    METHOD_DEFAULTS,
    METHOD_KINDS,
    OURS,
    PAPER,
    SOURCES,
    defaults_from,
    ours,
)
from fedforge.algorithms.methods import all_methods, main, markdown
from fedforge.schedulers.fedast import ASYNC_METHODS
from fedforge.schedulers.multitask_sync import SYNC_METHODS

ROOT = Path(__file__).resolve().parents[2]
LOCATOR = re.compile(r"\b(Sec\.|Table|Alg\.|App\.|Eq\.|Fig\.)|§")  # § = spec note section


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_factory_defaults_equal_the_table(name):
    """What ``inspect.signature`` shows (config validation, ``--defaults``) is the table."""
    table = ALGORITHM_DEFAULTS.get(name)
    assert table is not None, f"{name}: add its defaults to fedforge.algorithms.defaults"
    factory = algorithm_hparams(name)
    assert set(table) == set(factory), f"{name}: table keys differ from the factory's"
    wrong = {k: (factory[k], table[k].value) for k in factory if not _same(factory[k],
                                                                          table[k].value)}
    assert not wrong, f"{name}: factory default != table (factory, table): {wrong}"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_factory_source_states_no_default(name):
    """A built-in factory's ``def`` has no ``= value``: the table is the only place."""
    factory = ALGORITHMS[name]
    tree = ast.parse(inspect.getsource(factory))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert not fn.args.defaults and not any(fn.args.kw_defaults), (
        f"{name}: write its defaults in fedforge.algorithms.defaults, not in the signature")
    if fn.args.args or fn.args.kwonlyargs:  # fedptr_s: **hparams, FedPTR's signature
        decorators = [ast.unparse(d) for d in fn.decorator_list]
        assert f"defaults_from('{name}')" in decorators, f"{name}: @defaults_from({name!r})"


def test_components_default_to_the_table():
    """The parts a factory builds default to the same values when built alone."""
    import dataclasses

    from fedforge.algorithms.fadamgc import GradientTracking
    from fedforge.algorithms.fedexp import extrapolation
    from fedforge.algorithms.fedptr import ProjectionConfig

    fedptr = ALGORITHM_DEFAULTS["fedptr"]
    for f in dataclasses.fields(ProjectionConfig):
        assert _same(f.default, fedptr[f.name].value), f.name
    tracking = inspect.signature(GradientTracking).parameters
    assert _same(tracking["fraction"].default, ALGORITHM_DEFAULTS["fadamgc"]["tracking_fraction"]
                 .value)
    assert _same(tracking["init"].default, ALGORITHM_DEFAULTS["fadamgc"]["tracking_init"].value)
    eps = inspect.signature(extrapolation).parameters["eps"].default
    assert _same(eps, ALGORITHM_DEFAULTS["fedexp"]["eps"].value)


def _toy(monkeypatch, **entries):
    """A throw-away table entry ``toy`` for the decorator's checks."""
    monkeypatch.setitem(ALGORITHM_DEFAULTS, "toy",
                        {k: ours(v, "a test value, long enough to read as a reason")
                         for k, v in entries.items()})


def test_defaults_from_sets_the_defaults_in_parameter_order(monkeypatch):
    _toy(monkeypatch, b=2.0, a=1, c="x")

    @defaults_from("toy")
    def toy(a: int, b: float, *, c: str) -> tuple:
        return a, b, c

    assert toy() == (1, 2.0, "x") and toy(5, c="y") == (5, 2.0, "y")
    assert [p.default for p in inspect.signature(toy).parameters.values()] == [1, 2.0, "x"]


@pytest.mark.parametrize("source, problem", [
    ("def toy(a, b): ...", "table keys that are not parameters: ['c']"),
    ("def toy(a, b, c, d): ...", "parameters without a table entry: ['d']"),
    ("def toy(a, b, c=3): ...", "defaults written in the signature too: ['c']"),
    ("def toy(a, b, c, *rest): ...", "parameters that cannot take a default: ['rest']"),
])
def test_defaults_from_refuses_a_mismatch(monkeypatch, source, problem):
    _toy(monkeypatch, a=1, b=2, c=3)
    scope: dict = {}
    exec(source, scope)  # noqa: S102 (a one-line def)
    with pytest.raises(TypeError, match=re.escape(problem)):
        defaults_from("toy")(scope["toy"])


def test_defaults_from_needs_a_table_entry():
    with pytest.raises(TypeError, match="no table entry named 'nosuch'"):
        defaults_from("nosuch")(lambda a: a)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithm_reports_its_registry_name(name):
    """Logs, checkpoints and comparisons name a run's algorithm by ``Algorithm.name``."""
    algo = build_algorithm(name)
    assert algo.name == name and algo.description


@pytest.mark.parametrize("name", sorted(set(ALGORITHMS) - {"fedptr", "fedptr_s", "fedproto",
                                                             "ifca", "moon", "fedgen"}))
def test_defaults_in_effect_equal_the_table(name):
    """Built without arguments, an algorithm trains exactly as with the table's values passed
    explicitly (a default changed inside the factory, not in its signature, shows here).
    FedPTR's MTT needs image data, FedProto, MOON and FedGen a classifier's linear head (FedGen's
    are checked in tests/algorithms/test_fedgen.py), IFCA a model
    to initialise its clusters from (tests/algorithms/test_clustered.py checks it); their
    defaults are read from the signature above."""
    from tests.algorithms.multiround import SCHEDULE, run

    table = {k: d.value for k, d in ALGORITHM_DEFAULTS[name].items()}
    implicit = run(build_algorithm(name), SCHEDULE[:2])
    explicit = run(build_algorithm(name, **table), SCHEDULE[:2])
    # the local optimizer's stages too (a clip that never binds on this problem still shows)
    assert _stages(build_algorithm(name)) == _stages(build_algorithm(name, **table))
    for a, b in zip(implicit, explicit):
        assert np.array_equal(a.params, b.params)
        assert a.clients.keys() == b.clients.keys()
        for k in a.clients:
            assert np.array_equal(a.clients[k], b.clients[k]), k


def _stages(algo) -> list[str]:
    """The local optimizer's state layout (its chain of named stages), flattened."""
    import torch

    from fedforge.client.transforms import RoundContext

    params = {"w": torch.zeros(2, dtype=torch.float64)}
    algo.bind_population(2)  # AFL's weight per client
    ctx = RoundContext(params, {**algo.broadcast(algo.server_init(params)),
                                "round": torch.tensor(1.0)}, algo.client_init(params), {})
    return sorted(_paths(algo.local_optimizer.init(params, ctx)))


def _paths(tree, prefix=""):
    """Every key path of a nested dict, empty stages (stateless transforms) included."""
    for k, v in tree.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _paths(v, prefix + k + "/")


def test_no_table_entry_without_an_algorithm():
    assert set(ALGORITHM_DEFAULTS) <= set(ALGORITHMS)
    assert set(METHOD_DEFAULTS) == set(ASYNC_METHODS) | set(SYNC_METHODS)


def test_the_tables_method_kinds_are_the_drivers_method_lists():
    """The table names each multi-task method's kind itself (it may not import sim); the
    drivers' own lists must agree with it, order included (``fedforge algorithms`` lists them
    in that order)."""
    assert [m for m, k in METHOD_KINDS.items() if k == "async"] == list(ASYNC_METHODS)
    assert [m for m, k in METHOD_KINDS.items() if k == "multi-task baseline"] == list(SYNC_METHODS)
    assert list(METHOD_KINDS) == list(METHOD_DEFAULTS)


def _entries():
    for table in (ALGORITHM_DEFAULTS, METHOD_DEFAULTS):
        for name, params in table.items():
            for key, d in params.items():
                yield name, key, d


def test_every_source_names_where_or_why():
    for name, key, d in _entries():
        where = f"{name}.{key}"
        assert d.source in SOURCES, where
        if d.source == PAPER:  # a section, table, algorithm, appendix, equation or figure
            assert LOCATOR.search(d.ref), f"{where}: paper source without a locator: {d.ref}"
        elif d.source == CODE:  # a repository (owner/name) and a file or setting
            assert "/" in d.ref, f"{where}: official code without a repository: {d.ref}"
        else:
            assert d.source == OURS and len(d.ref) >= 20, f"{where}: ours needs a reason"


@pytest.mark.parametrize("method", sorted(METHOD_DEFAULTS))
def test_multitask_options_are_of_the_methods_kind(method):
    """An async method's options live in ``[async]``, a baseline's in ``[sync]``, and its
    tasks' client work in ``client.*`` (the config sections take their defaults from this
    table: tests/experiment/test_run_kinds.py)."""
    kind = "async" if method in ASYNC_METHODS else "sync"
    assert all(k.startswith((kind + ".", "client.")) for k in METHOD_DEFAULTS[method])
    assert {k for k in METHOD_DEFAULTS[method] if k.startswith("client.")} == {
        "client.batch_size", "client.local_steps"}


def test_all_methods_lists_every_kind():
    methods = all_methods()
    assert set(methods) == (set(ALGORITHMS) | set(ASYNC_METHODS) | set(SYNC_METHODS)
                            | {"power_of_choice", "oort"})
    assert methods["oort"] == methods["power_of_choice"] == "sampler"
    assert methods["scaffold"] == "sync"
    assert methods["fedbuff"] == "async"
    assert methods["sync_st"] == "multi-task baseline"


def test_resolved_hparams_fills_every_default():
    got = resolved_hparams("fedadam", {"server_lr": 0.1})
    assert list(got) == list(algorithm_hparams("fedadam"))
    assert got["server_lr"] == 0.1 and got["b2"] == 0.99 and got["tau"] == 1e-3
    build_algorithm("fedadam", **got)  # the resolved set is a valid full set
    with pytest.raises(ValueError, match="algorithm.beta2: not a hyper-parameter"):
        resolved_hparams("fedadam", {"beta2": 0.9})
    with pytest.raises(ValueError, match="unknown algorithm"):
        resolved_hparams("fedsgd", {})


def test_docs_page_is_current():
    """docs/algorithms.md is generated; regenerate with
    ``python -m fedforge.algorithms.defaults docs/algorithms.md``."""
    page = ROOT / "docs" / "algorithms.md"
    assert page.read_text(encoding="utf-8") == markdown(), (
        "docs/algorithms.md is stale: python -m fedforge.algorithms.defaults docs/algorithms.md")


def test_docs_page_writer(tmp_path):
    assert main([str(tmp_path / "a.md")]) == 0
    assert (tmp_path / "a.md").read_text(encoding="utf-8") == markdown()


def test_cli_lists_every_method_with_kind_and_params(monkeypatch):
    from fedforge import cli

    monkeypatch.setattr(cli.console, "width", 250)  # no wrapping inside table cells
    app, runner = cli.app, CliRunner()
    out = runner.invoke(app, ["algorithms"])
    assert out.exit_code == 0, out.output
    for name in [*all_methods(), *ALIASES]:  # every name the CLI accepts, aliases too
        assert name in out.output
    assert "multi-task baseline" in out.output and "async" in out.output
    params = runner.invoke(app, ["algorithms", "--params", "fedyogi"])
    assert params.exit_code == 0, params.output
    for key in algorithm_hparams("fedyogi"):
        assert key in params.output
    assert "Sec. 5: β2 = 0.99" in params.output
    fedast = runner.invoke(app, ["algorithms", "--params", "fedast"])
    assert fedast.exit_code == 0 and "async.variance_window" in fedast.output
    bad = runner.invoke(app, ["algorithms", "--params", "fedsgd"])
    assert bad.exit_code == 2 and "unknown method" in bad.output


def test_the_readme_states_the_number_of_distinct_methods():
    """The README's count is every accepted method with its variants folded in; a new
    method (or variant) fails here until the README (or ``VARIANT_OF``) says so."""
    import re

    from fedforge.algorithms.methods import VARIANT_OF, all_methods, distinct_methods

    assert set(VARIANT_OF) <= set(all_methods())
    assert set(VARIANT_OF.values()) <= set(distinct_methods())  # a variant of a method
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"\*\*(\d+) distinct methods\*\*", readme)
    assert stated and int(stated.group(1)) == len(distinct_methods())
