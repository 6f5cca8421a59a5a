"""fedforge: federated learning research simulator.

The extension API is importable from here (``fedforge.register_algorithm``, ...); it is
loaded on first use so that ``import fedforge`` and ``fedforge --help`` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXTENSION_API = ("register_algorithm", "register_dataset", "register_model",
                  "register_partitioner", "load_plugins")
__all__ = ["__version__", *_EXTENSION_API]

if TYPE_CHECKING:
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
    raise AttributeError(f"module 'fedforge' has no attribute {name!r}")
