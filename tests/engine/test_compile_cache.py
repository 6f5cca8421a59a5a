"""``engine.compile`` reuses torch's own compile caches across processes.

The fast tests check the settings :func:`use_compile_cache` makes; the slow one compiles a
tiny function in two fresh interpreters sharing one cache directory and expects the second
to hit inductor's FX-graph cache.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config

from fedforge.engine import VmapEngine
from fedforge.engine.compile_cache import CACHE_ENV, default_cache_dir, use_compile_cache


@pytest.fixture
def caches_off():
    """torch's own ``config.patch``: pytest's monkeypatch (9.2 and later) deletes on undo an
    attribute that is not in the module's ``__dict__``, which removes a torch config entry."""
    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        yield


@pytest.fixture
def no_cache_env(monkeypatch):
    """Unset, and restored afterwards even though the code under test sets it."""
    monkeypatch.setenv(CACHE_ENV, "")
    monkeypatch.delenv(CACHE_ENV)


def test_sets_a_per_user_cache_dir_when_unset(monkeypatch, tmp_path, caches_off, no_cache_env):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert use_compile_cache() == tmp_path / "fedforge" / "inductor"
    assert os.environ[CACHE_ENV] == str(tmp_path / "fedforge" / "inductor")
    assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache


def test_leaves_the_users_cache_dir_alone(monkeypatch, tmp_path, caches_off):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert use_compile_cache() == tmp_path / "mine"
    assert os.environ[CACHE_ENV] == str(tmp_path / "mine")
    assert inductor_config.fx_graph_cache


def test_default_dir_without_xdg(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "fedforge" / "inductor"


def test_compiling_engine_sets_the_cache_dir(monkeypatch, tmp_path, no_cache_env):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    VmapEngine().wrap(lambda *a: a)
    assert CACHE_ENV not in os.environ  # eager: nothing to cache
    VmapEngine(compile=True).wrap(lambda *a: a)  # torch.compile is lazy: no compiling here
    assert os.environ[CACHE_ENV] == str(tmp_path / "fedforge" / "inductor")


# The child turns both caches off first, so only use_compile_cache() can turn them back on.
CHILD = """
import json, torch
import torch._functorch.config as fc, torch._inductor.config as ic
from torch._dynamo.utils import counters
ic.fx_graph_cache = False
fc.enable_autograd_cache = False
from fedforge.engine.compile_cache import use_compile_cache
use_compile_cache()
f = torch.compile(lambda x: (x * 2.0).sin().sum())
f(torch.ones(4))
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


@pytest.mark.slow
def test_second_process_hits_the_fx_graph_cache(tmp_path):
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                             text=True, timeout=300, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    assert runs[0]["miss"] >= 1 and runs[0]["hit"] == 0
    assert runs[1]["hit"] >= 1 and runs[1]["miss"] == 0


def _graph_targets(precision: str) -> list[str]:
    """What dynamo captures from the classification loss, with a recording backend."""
    from fedforge.engine import classification_loss

    seen: list[str] = []

    def record(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    loss = classification_loss(torch.nn.Linear(3, 2), precision)
    params = dict(loss.model.named_parameters())
    x, y, w = torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), torch.ones(4)
    torch._dynamo.reset()
    torch.compile(loss, backend=record)(params, x, y, w)
    return seen


def test_fp32_loss_opens_no_autocast_region():
    """An autocast region in the graph, even a disabled one, makes AOTAutograd bypass its
    cache, so every new process would re-trace the backward."""
    assert not any("autocast" in t for t in _graph_targets("fp32"))
    assert any("autocast" in t for t in _graph_targets("bf16"))  # the check can see one
