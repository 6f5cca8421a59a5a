"""A new algorithm from existing parts: FedProx local steps with a FedYogi server.

Run it like any registered algorithm:

    python examples/custom_algorithm.py            # registers it, then runs the quickstart

Everything below the imports is the whole algorithm: a factory whose keyword arguments are
its hyper-parameters (the config's ``[algorithm]`` keys), built from a local transform chain,
a server optimizer and no extra parts.
"""

from fedforge.algorithms import Algorithm, register
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import add_prox, chain
from fedforge.server.optimizers import server_yogi


def fedprox_yogi(local_lr: float = 0.01, mu: float = 0.01, server_lr: float = 0.01,
                 tau: float = 1e-3) -> Algorithm:
    """FedProx's proximal local steps (Li et al. 2020) + FedYogi's server (Reddi et al. 2021)."""
    return Algorithm(
        "fedprox_yogi",
        chain(add_prox(mu), local_optimizer("sgd", local_lr)),
        server_yogi(lr=server_lr, tau=tau),
        description="FedProx local steps with a FedYogi server",
    )


register("fedprox_yogi", fedprox_yogi)

if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    from fedforge.experiment.config import load_config
    from fedforge.experiment.runner import run_experiment

    cfg = load_config(Path(__file__).with_name("quickstart.toml"),
                      ["algorithm.name=fedprox_yogi", "rounds=5"])
    with tempfile.TemporaryDirectory() as tmp:
        last = run_experiment(cfg, Path(tmp) / "run", progress=False)[-1]
    print(f"fedprox_yogi: round {last['round']} test_accuracy={last['test_accuracy']:.4f}")
