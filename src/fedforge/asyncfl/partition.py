"""FedAST's label-skew split: each client draws its own label mix and a fixed sample count.

Client i draws ``p_i ~ Dir(alpha * 1)`` and takes ``round(n * p_ik)`` samples of class k,
without replacement, from a per-class pool that is refilled (reshuffled) when exhausted, so
every client holds about ``n`` samples however many clients there are ("repeating the train
set if necessary", App. C.3). Rounding makes a client's total differ from ``n`` by a few.
"""

from __future__ import annotations

import numpy as np


def dirichlet_fixed_size(labels: np.ndarray, num_clients: int, alpha: float,
                         samples_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
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
