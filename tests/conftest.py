"""Suite-wide pytest settings.

The default run deselects ``slow`` tests (``addopts = -m 'not slow'``): about 8 minutes on 2
cores. CI (``CI=true``, as `.ci/run` is run) also runs them: kill-and-resume, the soak, the
golden metrics, localhost Flower deployments, sweeps and real-data examples, about 30
minutes in all. An explicit ``-m`` on the command line wins.
"""

import os

# Numpy's OpenBLAS, one thread: with its thread pool, a Flower simulation's server thread hung
# in OpenBLAS (numpy matmul in the synthetic dataset's generator) late in the full CI=true
# run, after the bench and torchrun tests, though every part passed on its own. The
# BLAS calls here are tiny; the variable is read when numpy loads, so this must come first.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# Real datasets come from the tests' own setting (tests/data_location.py), handed to fedforge
# as a user would: $FEDFORGE_DATA, inherited by the runs tests start in subprocesses.
from tests.data_location import TEST_DATA  # noqa: E402

if TEST_DATA.is_dir():
    os.environ.setdefault("FEDFORGE_DATA", str(TEST_DATA))


def pytest_configure(config):
    explicit = any(a == "-m" or a.startswith("-m") for a in config.invocation_params.args)
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if in_ci and not explicit and config.option.markexpr == "not slow":
        config.option.markexpr = ""
