"""Partitioners: how a centralised training set is split over simulated clients.

Each returns ``list[np.ndarray]``, one sorted int64 index array per client, is a pure function
of its arguments and the ``np.random.Generator`` passed in (same seed -> same split), and
assigns every sample to exactly one client (``natural`` follows the given groups instead).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from fedforge.data.huggingface import FLWR_PARTITIONERS


def _as_int_array(values: Any, what: str) -> np.ndarray:
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be a 1-D integer array, got shape {arr.shape} {arr.dtype}")
    return arr


def _check_counts(num_samples: int, num_clients: int, min_per_client: int = 1) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients * min_per_client > num_samples:
        raise ValueError(
            f"cannot give {num_clients} clients {min_per_client}+ samples each from "
            f"{num_samples} samples"
        )


def group_by_client(indices: np.ndarray, owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Split ``indices`` by ``owner`` (client id per entry) into sorted per-client arrays."""
    order = np.lexsort((indices, owner))
    counts = np.bincount(owner, minlength=num_clients)
    return [a.astype(np.int64) for a in np.split(indices[order], np.cumsum(counts)[:-1])]


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random, equal-sized (+-1) clients: the homogeneous baseline."""
    _check_counts(num_samples, num_clients)
    owner = np.repeat(np.arange(num_clients), _even_sizes(num_samples, num_clients))
    return group_by_client(rng.permutation(num_samples), owner, num_clients)


def _even_sizes(n: int, k: int) -> np.ndarray:
    return np.full(k, n // k, dtype=np.int64) + (np.arange(k) < n % k)


def dirichlet_label(
    labels: Any,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label skew: class c is spread over clients by proportions ~ Dir(alpha) (Hsu et al. 2019).

    Small ``alpha`` (0.1) gives few classes per client, large (100) is nearly IID. Proportions
    are redrawn until every client holds at least ``min_size`` samples.
    """
    y = _as_int_array(labels, "labels")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check_counts(len(y), num_clients)
    if num_clients * min_size > len(y):
        raise ValueError(
            f"dirichlet_label: min_size={min_size} for each of {num_clients} clients needs "
            f"{num_clients * min_size} samples, only {len(y)} given"
        )
    classes, y_inv = np.unique(y, return_inverse=True)
    counts = np.bincount(y_inv, minlength=len(classes))
    for _ in range(max_tries):
        props = rng.dirichlet(np.full(num_clients, float(alpha)), size=len(classes))
        cuts = np.floor(np.cumsum(props, axis=1) * counts[:, None]).astype(np.int64)
        cuts[:, -1] = counts
        per_client = np.diff(cuts, axis=1, prepend=0)  # [classes, clients]
        if per_client.sum(axis=0).min() >= min_size:
            break
    else:
        raise ValueError(
            f"dirichlet_label: no split with every client >= min_size={min_size} samples after "
            f"{max_tries} tries (alpha={alpha}, num_clients={num_clients}, {len(y)} samples); "
            "lower min_size or num_clients, or raise alpha"
        )
    # class-major order, each class shuffled, then cut into the clients' consecutive runs
    order = np.lexsort((rng.random(len(y)), y_inv))
    owner = np.repeat(np.tile(np.arange(num_clients), len(classes)), per_client.ravel())
    return group_by_client(order, owner, num_clients)


def dirichlet_class(
    labels: Any, num_clients: int, alpha: float, rng: np.random.Generator, fraction: float = 1.0
) -> list[np.ndarray]:
    """Per-class Dirichlet split with no minimum size (Wang et al. 2020a; Acar et al. 2021;
    FedPTR App. D): for each class k, ``p_k ~ Dir_N(alpha)`` and client j gets the fraction
    ``p_kj`` of class k. At alpha = 0.01 clients can be empty (the runner warns and gives them
    no weight). ``fraction < 1`` first keeps a random ``fraction`` of each class (a stated
    reduced-scale run); the other samples belong to no client.
    """
    y = _as_int_array(labels, "labels")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    keep = np.arange(len(y))
    if fraction < 1:
        keep = np.sort(np.concatenate([
            rng.permutation(np.flatnonzero(y == c))[: int(round(fraction * (y == c).sum()))]
            for c in np.unique(y)
        ]))
    parts = dirichlet_label(y[keep], num_clients, alpha, rng, min_size=0)
    return [keep[p] for p in parts]


def dirichlet_equal(
    labels: Any, num_clients: int, alpha: float, rng: np.random.Generator,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """Equal-sized clients, each with its own label prior ``p_i ~ Dir(alpha 1_C)`` (the split
    of the FedDyn / FedExP / FedNAR code, ``getDirichletData_equal``).

    Every client gets ``samples_per_client`` samples (default ``N // num_clients``; the rest
    belong to no client). Draws are sequential: a uniformly random client that is not yet
    full draws a class from its prior and takes the next unused sample of that class. The
    code re-draws while the class is exhausted; drawing from the prior renormalised over the
    classes still available is the same distribution and always terminates.
    """
    y = _as_int_array(labels, "labels")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check_counts(len(y), num_clients)
    size = len(y) // num_clients if samples_per_client is None else int(samples_per_client)
    if not 1 <= size * num_clients <= len(y):
        raise ValueError(f"dirichlet_equal: samples_per_client={size} for {num_clients} "
                         f"clients needs {size * num_clients} samples, only {len(y)} given")
    classes, y_inv = np.unique(y, return_inverse=True)
    priors = rng.dirichlet(np.full(len(classes), float(alpha)), size=num_clients)  # [n, C]
    pools = [rng.permutation(np.flatnonzero(y_inv == c)) for c in range(len(classes))]
    left = np.array([len(p) for p in pools])  # unused samples per class
    need = np.full(num_clients, size)
    owner, taken = np.empty(size * num_clients, np.int64), np.empty(size * num_clients, np.int64)
    for s in range(size * num_clients):
        open_ = np.flatnonzero(need > 0)
        i = open_[rng.integers(len(open_))]
        p = priors[i] * (left > 0)
        p = p / p.sum() if p.sum() > 0 else (left > 0) / (left > 0).sum()
        c = min(int(np.searchsorted(np.cumsum(p), rng.random(), side="right")), len(p) - 1)
        while left[c] == 0:  # float round-off at the top of the CDF
            c -= 1
        left[c] -= 1
        need[i] -= 1
        owner[s], taken[s] = i, pools[c][left[c]]
    return group_by_client(taken, owner, num_clients)


def shards(
    labels: Any, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """McMahan et al. (2017) pathological split: sort by label, cut into
    ``num_clients * classes_per_client`` equal shards and deal each client that many shards,
    so most clients see about ``classes_per_client`` classes.
    """
    y = _as_int_array(labels, "labels")
    if classes_per_client < 1:
        raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
    n_shards = num_clients * classes_per_client
    _check_counts(len(y), n_shards)
    order = np.lexsort((rng.random(len(y)), y))  # by label, random within a label
    shard_of_pos = np.repeat(np.arange(n_shards), _even_sizes(len(y), n_shards))
    client_of_shard = np.empty(n_shards, dtype=np.int64)
    dealt = np.repeat(np.arange(num_clients), classes_per_client)
    client_of_shard[rng.permutation(n_shards)] = dealt
    return group_by_client(order, client_of_shard[shard_of_pos], num_clients)


def quantity_skew(
    num_samples: int,
    num_clients: int,
    rng: np.random.Generator,
    sigma: float = 1.0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """IID labels but unequal sizes: client shares ~ LogNormal(0, ``sigma``), >= ``min_size``."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    _check_counts(num_samples, num_clients, max(min_size, 0))
    w = rng.lognormal(0.0, sigma, num_clients)
    extra = num_samples - num_clients * min_size
    raw = w / w.sum() * extra
    sizes = np.floor(raw).astype(np.int64)
    short = extra - int(sizes.sum())  # largest remainders get the leftover samples
    sizes[np.argsort(-(raw - sizes), kind="stable")[:short]] += 1
    owner = np.repeat(np.arange(num_clients), sizes + min_size)
    return group_by_client(rng.permutation(num_samples), owner, num_clients)


def natural(groups: Any) -> list[np.ndarray]:
    """One client per distinct group id (sorted): keeps each writer/role/device intact."""
    g = _as_int_array(groups, "groups")
    uniq, owner = np.unique(g, return_inverse=True)
    return group_by_client(np.arange(len(g)), owner.ravel(), len(uniq))


def dirichlet_fixed_size(labels: np.ndarray, num_clients: int, alpha: float,
                         samples_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """FedAST's label-skew split: each client draws its own label mix and a fixed size.

    Client i draws ``p_i ~ Dir(alpha * 1)`` and takes ``round(n * p_ik)`` samples of class k,
    without replacement, from a per-class pool that is refilled (reshuffled) when exhausted, so
    every client holds about ``n`` samples however many clients there are ("repeating the
    train set if necessary", FedAST App. C.3). Rounding makes a client's total differ from
    ``n`` by a few. Unlike the partitioners above, a sample may go to several clients or to
    none, so multi-task runs call it directly (``partition = "dirichlet_fixed"``) rather than
    through :func:`partition`.
    """
    if alpha <= 0:
        raise ValueError(f"partition_options.alpha: expected > 0, got {alpha}")
    if samples_per_client < 1:
        raise ValueError(f"partition_options.samples_per_client: expected >= 1, got "
                         f"{samples_per_client}")
    y = np.asarray(labels)
    classes = np.unique(y)
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    cursor = [0] * len(classes)
    out = []
    for _ in range(num_clients):
        p = rng.dirichlet(np.full(len(classes), float(alpha)))
        counts = np.rint(p * samples_per_client).astype(np.int64)
        if counts.sum() == 0:
            counts[int(np.argmax(p))] = 1
        mine = []
        for k, cnt in enumerate(counts):
            while cnt > 0:
                if cursor[k] >= len(pools[k]):  # refill an exhausted class pool
                    pools[k], cursor[k] = rng.permutation(pools[k]), 0
                take = min(int(cnt), len(pools[k]) - cursor[k])
                mine.append(pools[k][cursor[k]:cursor[k] + take])
                cursor[k] += take
                cnt -= take
        out.append(np.sort(np.concatenate(mine)).astype(np.int64))
    return out


def label_matched_tests(train_labels: Any, parts: list[np.ndarray], test_labels: Any,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's own test samples with its training label mix: class c's test samples
    are shuffled and cut among the clients in proportion to their training samples of c
    (clients holding none of c get none). For per-client evaluation under label partitions.
    """
    y = _as_int_array(train_labels, "labels")
    yt = _as_int_array(test_labels, "test labels")
    if not parts:
        return []
    classes = np.union1d(y, yt)
    owner = np.full(len(y), -1, dtype=np.int64)
    for i, p in enumerate(parts):
        owner[p] = i
    held = owner >= 0
    counts = np.zeros((len(classes), len(parts)), dtype=np.int64)  # [classes, clients]
    np.add.at(counts, (np.searchsorted(classes, y[held]), owner[held]), 1)
    totals = counts.sum(axis=1)
    yt_inv = np.searchsorted(classes, yt)
    test_counts = np.bincount(yt_inv, minlength=len(classes))
    test_counts[totals == 0] = 0  # a class no client holds: its test samples go to no one
    share = np.cumsum(counts, axis=1) / np.maximum(totals, 1)[:, None]
    cuts = np.floor(share * test_counts[:, None]).astype(np.int64)
    cuts[:, -1] = test_counts
    per_client = np.diff(cuts, axis=1, prepend=0)
    order = np.lexsort((rng.random(len(yt)), yt_inv))  # class-major, shuffled in a class
    sizes = np.bincount(yt_inv, minlength=len(classes))
    rank = np.arange(len(yt)) - (np.cumsum(sizes) - sizes)[yt_inv[order]]
    kept = order[rank < test_counts[yt_inv[order]]]  # the first test_counts[c] of class c
    owners = np.repeat(np.tile(np.arange(len(parts)), len(classes)), per_client.ravel())
    return group_by_client(kept, owners, len(parts))


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet_label,
    "dirichlet_class": dirichlet_class,
    "dirichlet_equal": dirichlet_equal,
    "shards": shards,
    "quantity_skew": quantity_skew,
    "natural": natural,
    **FLWR_PARTITIONERS,  # flwr-datasets' partitioners (fedforge[huggingface])
}
_ALIASES = {"dirichlet_label": "dirichlet", "pathological": "shards", "quantity": "quantity_skew"}


def partition(
    name: str,
    labels: Any,
    num_clients: int | None,
    rng: np.random.Generator,
    groups: Any = None,
    **kw: Any,
) -> list[np.ndarray]:
    """Run partitioner ``name`` with the arguments it needs, checking options up front.

    ``natural`` needs ``groups`` and takes the first ``num_clients`` groups (all if ``None``);
    the others need ``num_clients`` and their own options (e.g. ``alpha`` for ``dirichlet``).
    """
    key = _ALIASES.get(name, name)
    if key not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; known: {', '.join(PARTITIONERS)}")
    if key == "natural":
        if groups is None:
            raise ValueError("partition 'natural' needs groups= (a natural client id per sample)")
        if kw:
            raise ValueError(f"partition 'natural' takes no options, got {sorted(kw)}")
        parts = natural(groups)
        if num_clients is not None:
            if not 1 <= num_clients <= len(parts):
                raise ValueError(f"num_clients={num_clients} but there are {len(parts)} groups")
            parts = parts[:num_clients]
        return parts
    fn = PARTITIONERS[key]
    signature = inspect.signature(fn).parameters
    count = signature.get("num_clients")
    if num_clients is None and (count is None or count.default is inspect.Parameter.empty):
        raise ValueError(f"partition {key!r} needs num_clients")
    if "groups" in signature:  # e.g. flwr:natural_id: the dataset's natural client ids
        kw = {**kw, "groups": groups}
    params = list(signature.values())[1:]  # after labels/num_samples
    options = {p.name: p for p in params if p.name not in ("num_clients", "rng", "groups")}
    unknown = sorted(set(kw) - set(options) - {"groups"})
    if unknown:
        raise ValueError(
            f"partition {key!r}: unknown option(s) {unknown}; accepts {sorted(options)}"
        )
    empty = inspect.Parameter.empty
    missing = [k for k, p in options.items() if p.default is empty and k not in kw]
    if missing:
        raise ValueError(f"partition {key!r} needs option(s) {missing} (pass them as keywords)")
    if next(iter(inspect.signature(fn).parameters)) == "num_samples":
        first = labels if isinstance(labels, (int, np.integer)) else len(labels)
        return fn(int(first), num_clients=num_clients, rng=rng, **kw)
    by_label = not key.startswith("flwr:") or (key in ("flwr:dirichlet", "flwr:pathological")
                                               and kw.get("partition_by", "label") == "label")
    if by_label and np.ndim(labels) > 1:  # next-token labels: one per position
        raise ValueError(f"data.partition: {key!r} splits by class labels, and next-token data "
                         "has none; use iid, or natural with a client id")
    return fn(labels, num_clients=num_clients, rng=rng, **kw)
