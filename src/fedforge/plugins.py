"""The public extension API: add algorithms, datasets, models and partitioners, and load the
user modules that do so (``--plugin`` on the command line).

A plugin is code: importing it runs it. A config's ``plugins = [...]`` only names the modules
a run needs; loading a config never imports them (:func:`is_loaded` tells whether they were
given), except where the user asks for it (``--allow-config-plugins``).

Each ``register_*`` is a thin wrapper over the one registry of its concept
(``fedforge.algorithms.ALGORITHMS``, the dataset registry in ``fedforge.data.loaders``,
``fedforge.models.MODELS``, ``fedforge.data.PARTITIONERS``): a registered name is accepted
everywhere a built-in one is (configs, ``fedforge compare -a``, ``fedforge algorithms``).
A name already taken by something else is refused; registering the same object again (a
plugin imported twice) is a no-op. ``docs/extending.md`` walks through each one.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

__all__ = ["PluginError", "is_loaded", "load_plugins", "register_algorithm", "register_dataset",
           "register_model", "register_partitioner"]


class PluginError(ImportError):
    """A user module that cannot be imported; the message is one line naming it."""


def _same(a: object, b: object) -> bool:
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return a is b or key(a) == key(b)


def _check_name(kind: str, name: str, taken: dict, new: object, replace: bool,
                builtin: Iterable[str]) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_{kind}: {name!r} is not a valid name (letters, digits, _)")
    if name in taken and not _same(_unwrap(taken[name]), new):
        if name in builtin or not replace:
            hint = "" if name in builtin else "; pass replace=True to replace it"
            raise ValueError(f"register_{kind}: {name!r} is already registered{hint}")


def _unwrap(entry: object) -> object:
    return entry[0] if isinstance(entry, tuple) else entry  # MODELS holds (class, description)


def register_algorithm(name: str, factory: Callable, *, replace: bool = False) -> None:
    """Make ``factory`` the algorithm ``name``.

    ``factory(**hparams) -> fedforge.algorithms.Algorithm``; its keyword arguments, each
    with a default, are the config's ``[algorithm]`` hyper-parameters (unknown keys and
    non-positive ``*lr`` values are then refused with the field named).
    """
    from fedforge.algorithms import ALGORITHMS, ALIASES, register

    _check_name("algorithm", name, {**ALGORITHMS, **dict.fromkeys(ALIASES, None)}, factory,
                replace, _BUILTIN_ALGORITHMS | set(ALIASES))
    missing = [p.name for p in inspect.signature(factory).parameters.values()
               if p.default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"register_algorithm: {name!r}: every hyper-parameter needs a default "
                         f"(no default for {missing})")
    register(name, factory)


def register_dataset(name: str, loader: Callable, description: str, *,
                     folder: str | None = None, files: tuple[str, ...] = (), source: str = "",
                     replace: bool = False) -> None:
    """Make ``loader`` the dataset ``name`` (the config's ``data.dataset``; lower case).

    ``loader(root, **options) -> fedforge.data.DatasetSplits`` reads files under the data
    root fedforge resolved (``root`` is that folder); give the dataset's ``folder`` under it,
    the ``files`` it needs and ``source`` (how to get them), and a missing dataset is
    reported in one line before the loader runs. A loader without a ``root`` parameter needs
    no files. Its other keyword arguments are the config's ``data.options``.
    """
    from fedforge.data.loaders import _REGISTRY, DatasetEntry

    if isinstance(name, str) and name != name.lower():
        raise ValueError(f"register_dataset: {name!r}: dataset names are lower case")
    _check_name("dataset", name, {k: e.loader for k, e in _REGISTRY.items()}, loader, replace,
                _BUILTIN_DATASETS)
    _REGISTRY[name] = DatasetEntry(loader, description, folder, tuple(files), source)


def register_model(name: str, cls: Callable, description: str = "", *,
                   replace: bool = False) -> None:
    """Make ``cls(input_shape, num_classes, **options)`` the model ``name``.

    ``options`` are the config's ``[model.options]``. The model must be buffer-free (no
    BatchNorm running statistics) so a cohort can be trained as one vmapped computation.
    """
    from fedforge.models import MODELS

    _check_name("model", name, MODELS, cls, replace, _BUILTIN_MODELS)
    MODELS[name] = (cls, description or (inspect.getdoc(cls) or name).splitlines()[0])


def register_partitioner(name: str, fn: Callable, *, replace: bool = False) -> None:
    """Make ``fn`` the partition ``name`` (the config's ``data.partition``).

    ``fn(labels, num_clients=, rng=, **options) -> list of index arrays`` (one per client;
    name the first parameter ``num_samples`` to get the sample count instead of the labels);
    ``options`` are the config's ``[data.partition_options]``.
    """
    from fedforge.data.partition import PARTITIONERS

    _check_name("partitioner", name, PARTITIONERS, fn, replace, _BUILTIN_PARTITIONERS)
    PARTITIONERS[name] = fn


def load_plugins(modules: Iterable[str], where: str = "--plugin") -> list[ModuleType]:
    """Import each user module (a dotted name, or a ``.py`` file path) so its ``register_*``
    calls run; the current folder is importable. ``where`` names the setting in errors."""
    loaded = []
    for name in modules:
        try:
            loaded.append(_import(name))
        except PluginError:
            raise
        except BaseException as exc:  # noqa: BLE001 (a user module may raise anything)
            if isinstance(exc, KeyboardInterrupt):
                raise
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise PluginError(f"{where}: plugin {name!r} failed to import: "
                              f"{type(exc).__name__}: {text}") from None
    return loaded


def is_loaded(name: str) -> bool:
    """Whether the plugin ``name`` (as :func:`load_plugins` takes it) is imported already, so
    that a config naming it needs no import (a check only: nothing is imported or run)."""
    if not isinstance(name, str) or not name:
        return False
    if _is_path(name):
        return _loaded_file(Path(name).expanduser()) is not None
    return name in sys.modules


def _is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name or "\\" in name


def _loaded_file(path: Path) -> ModuleType | None:
    """The module already imported from the ``.py`` file ``path``, if any."""
    module = sys.modules.get(path.stem)
    if module is not None and getattr(module, "__file__", None) == str(path.resolve()):
        return module
    return None


def _import(name: str) -> ModuleType:
    if _is_path(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        mod_name = path.stem
        if (module := _loaded_file(path)) is not None:
            return module
        spec = importlib.util.spec_from_file_location(mod_name, path.resolve())
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `fedforge` scripts do not put the cwd there
    return importlib.import_module(name)


def _builtin(module: str, attr: str) -> frozenset[str]:
    return frozenset(getattr(importlib.import_module(module), attr))


_BUILTIN_ALGORITHMS = _builtin("fedforge.algorithms", "ALGORITHMS")
_BUILTIN_MODELS = _builtin("fedforge.models", "MODELS")
_BUILTIN_PARTITIONERS = _builtin("fedforge.data.partition", "PARTITIONERS")
_BUILTIN_DATASETS = _builtin("fedforge.data.loaders", "_REGISTRY")
