"""Synthetic(alpha, beta): the federated logistic-regression benchmark of FedProx / LEAF.

Li et al. 2020, "Federated Optimization in Heterogeneous Networks", Sec. 5.1. ``alpha`` sets
how much the clients' *models* differ, ``beta`` how much their *inputs* differ. It needs no
files and builds in milliseconds, which makes it the default dataset of the quickstart.

Generation, for client k (all draws from one ``numpy`` Generator seeded with ``seed``):

* ``u_k ~ N(0, alpha)``, ``W_k[i, j] ~ N(u_k, 1)`` (``num_classes x dim``), ``b_k[i] ~ N(u_k, 1)``
* ``B_k ~ N(0, beta)``, ``v_k[j] ~ N(B_k, 1)``; ``Sigma`` diagonal with ``Sigma_jj = j^-1.2``
* ``x ~ N(v_k, Sigma)``, ``y = argmax(softmax(W_k x + b_k)) = argmax(W_k x + b_k)``

As in the FedProx generator, ``alpha`` and ``beta`` are used as standard deviations (at the
usual alpha = beta = 1 both readings agree). Client sizes follow FedProx/LEAF's power law:
``n_k = floor(LogNormal(4, 2)) + 50``, optionally capped by ``max_samples_per_client``. Each
client's samples are split ``train_fraction`` / rest into train / test. With ``iid=True`` every
client shares one ``W, b ~ N(0, 1)`` and ``v_k = 0`` (the IID control of the paper).
"""

from __future__ import annotations

import numpy as np
import torch

from fedforge.core.memory import check_allocation
from fedforge.data.base import DatasetSplits


def client_sizes_lognormal(
    num_clients: int,
    rng: np.random.Generator,
    mean: float = 4.0,
    sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int | None = None,
) -> np.ndarray:
    """Power-law client sizes ``floor(LogNormal(mean, sigma)) + min_samples`` (FedProx's choice)."""
    sizes = rng.lognormal(mean, sigma, num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    return sizes


def synthetic_nbytes(num_clients: int, dim: int, num_classes: int,
                     max_samples_per_client: int | None = None) -> int:
    """A lower bound on the bytes :func:`make_synthetic` holds at once: each client's float64
    model (drawn twice), its mean and at least 50 samples (float64 draws, float32 copies,
    labels and group ids), so a size that cannot fit is refused before the first draw."""
    per_model = 8 * (2 * num_classes * dim + num_classes + dim + 4)
    samples = min(50, max_samples_per_client or 50)
    per_sample = 8 * dim + 4 * dim + 3 * 8
    return num_clients * (per_model + samples * per_sample)


def check_synthetic(alpha: float, beta: float, num_clients: int, dim: int, num_classes: int,
                    train_fraction: float, max_samples_per_client: int | None) -> None:
    """Refuse parameters neither generator (this one, or the procedural
    :mod:`fedforge.data.population`) can draw from; ValueError naming the parameter."""
    if num_clients < 1 or dim < 1 or num_classes < 2:
        raise ValueError(
            f"need num_clients >= 1, dim >= 1, num_classes >= 2; got {num_clients}, {dim}, "
            f"{num_classes}"
        )
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if max_samples_per_client is not None and max_samples_per_client < 2:
        raise ValueError(f"max_samples_per_client must be >= 2, got {max_samples_per_client}")
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got {alpha}, {beta}")


def train_count(n: np.ndarray | int, train_fraction: float) -> np.ndarray:
    """Training samples of a client of ``n``: ``round(train_fraction * n)``, at least 1 and at
    most ``n - 1`` (both generators split each client this way, training samples first)."""
    return np.clip(np.round(train_fraction * np.asarray(n, dtype=np.float64)), 1,
                   np.asarray(n) - 1).astype(np.int32)


def draw_samples(rng: np.random.Generator, n: int, w: np.ndarray, b: np.ndarray,
                 v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the client with model ``w, b`` and input mean ``v``: float64 inputs
    ``x ~ N(v, Sigma)`` (``Sigma_jj = j^-1.2``) drawn from ``rng``, int64 labels
    ``argmax(w x + b)``."""
    sd = np.arange(1, v.shape[-1] + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt of Sigma_jj
    x = v + rng.standard_normal((n, v.shape[-1])) * sd
    return x, np.argmax(x @ w.T + b, axis=1).astype(np.int64)


def make_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    dim: int = 60,
    num_classes: int = 10,
    seed: int = 0,
    iid: bool = False,
    train_fraction: float = 0.8,
    max_samples_per_client: int | None = None,
) -> DatasetSplits:
    """Build Synthetic(alpha, beta) with one natural group per client (deterministic in seed)."""
    check_synthetic(alpha, beta, num_clients, dim, num_classes, train_fraction,
                    max_samples_per_client)
    check_allocation(synthetic_nbytes(num_clients, dim, num_classes, max_samples_per_client),
                     f"data.options.num_clients: {num_clients} synthetic clients of dim {dim}")
    rng = np.random.default_rng(seed)
    k, c = num_clients, num_classes
    if iid:
        w = np.broadcast_to(rng.standard_normal((c, dim)), (k, c, dim))
        b = np.broadcast_to(rng.standard_normal(c), (k, c))
        v = np.zeros((k, dim))
    else:
        u = rng.normal(0.0, alpha, k)
        w = u[:, None, None] + rng.standard_normal((k, c, dim))
        b = u[:, None] + rng.standard_normal((k, c))
        big_b = rng.normal(0.0, beta, k)
        v = big_b[:, None] + rng.standard_normal((k, dim))
    sizes = client_sizes_lognormal(k, rng, min_samples=50, max_samples=max_samples_per_client)

    parts: dict[str, list[np.ndarray]] = {n: [] for n in ("xtr", "ytr", "gtr", "xte", "yte", "gte")}
    for i, n in enumerate(sizes.tolist()):
        x, y = draw_samples(rng, n, w[i], b[i], v[i])
        n_tr = int(train_count(n, train_fraction))
        for tag, sl in (("tr", slice(0, n_tr)), ("te", slice(n_tr, n))):
            parts["x" + tag].append(x[sl])
            parts["y" + tag].append(y[sl])
            parts["g" + tag].append(np.full(len(y[sl]), i, dtype=np.int64))
    cat = {key: np.concatenate(val) for key, val in parts.items()}
    return DatasetSplits(
        name="synthetic",
        train_x=torch.from_numpy(cat["xtr"].astype(np.float32)),
        train_y=torch.from_numpy(cat["ytr"].astype(np.int64)),
        test_x=torch.from_numpy(cat["xte"].astype(np.float32)),
        test_y=torch.from_numpy(cat["yte"].astype(np.int64)),
        num_classes=num_classes,
        input_shape=(dim,),
        train_groups=cat["gtr"],
        test_groups=cat["gte"],
    )
