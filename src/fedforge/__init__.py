"""fedforge: federated learning research simulator.

The extension API is importable from here (``fedforge.register_algorithm``, ...); it is
loaded on first use so that ``import fedforge`` and ``fedforge --help`` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXTENSION_API = ("register_algorithm", "register_dataset", "register_model",
                  "register_partitioner", "load_plugins")
_OBJECT_API = ("Experiment", "RunConfig", "load_config", "run_experiment")
__all__ = ["__version__", *_EXTENSION_API, *_OBJECT_API]

if TYPE_CHECKING:
    from fedforge.experiment.config import RunConfig, load_config  # noqa: F401
    from fedforge.experiment.runner import Experiment, run_experiment  # noqa: F401
    from fedforge.plugins import (  # noqa: F401 (re-exported lazily below)
        load_plugins,
        register_algorithm,
        register_dataset,
        register_model,
        register_partitioner,
    )


def __getattr__(name: str):
    if name in _EXTENSION_API:
        from fedforge import plugins

        return getattr(plugins, name)
    if name in _OBJECT_API:  # the object API: Experiment.from_config(...).run(rounds)
        from fedforge.experiment import config, runner

        return getattr(runner if hasattr(runner, name) else config, name)
    raise AttributeError(f"module 'fedforge' has no attribute {name!r}")
