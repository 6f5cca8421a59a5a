"""W1/W2 throughput — a thin wrapper over ``fedforge bench`` (see src/fedforge/bench/).

    python benchmarks/w1_throughput.py w1 --cohorts 10,100 --engines plain,loop,vmap,vmap:bf16
"""

from fedforge.cli import app

if __name__ == "__main__":
    app(["bench", *__import__("sys").argv[1:]])
