"""Reuse ``torch.compile`` artifacts across processes with torch's own on-disk caches.

Compiling a vmapped chunk function takes tens of seconds to minutes on a small CPU. Inductor's
FX-graph cache and the AOTAutograd cache store the compiled graphs on disk, keyed by graph,
inputs and torch version, so a second process with the same model skips most of that work
(dynamo still traces the Python code again). Both caches are on by default in recent torch;
this module makes sure they are, and keeps them in a stable per-user directory instead of
torch's default under the temporary directory, which is often wiped at reboot.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedforge/inductor``, or ``~/.cache/fedforge/inductor``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedforge" / "inductor"


def use_compile_cache() -> Path:
    """Turn on torch's FX-graph and AOTAutograd caches and point ``TORCHINDUCTOR_CACHE_DIR``
    at :func:`default_cache_dir` unless the user has set it; returns the directory in use.

    Called before the first ``torch.compile`` (``engine.compile``). Environment switches that
    force a cache off (``TORCHINDUCTOR_FX_GRAPH_CACHE=0``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``)
    still win: torch applies them over these settings.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    if not os.environ.get(CACHE_ENV):
        os.environ[CACHE_ENV] = str(default_cache_dir())
    return Path(os.environ[CACHE_ENV])
