"""Client populations produced on demand: procedural LEAF Synthetic, O(cohort) draws, and
the evaluation sample of a population run.

``synthetic`` materialises every client at once, which caps it near 10^4 clients. The
procedural form, ``synthetic_population``, draws client ``k``'s whole dataset (its model
``W_k, b_k``, its input mean ``v_k``, its size and its samples) from a generator keyed by
``(seed, k)`` alone, so a run over 10^6 clients holds only the client sizes (4 bytes a
client) and generates a cohort's data when the cohort is sampled. The same client is the same
data whatever the cohort, the order of the draws or the population size around it.

Generation follows :mod:`fedforge.data.synthetic` (Li et al. 2020, Sec. 5.1); only the
random streams differ, so the two datasets are statistically alike but not equal:

* sizes: ``n_k = floor(LogNormal(4, 2)) + 50`` (capped by ``max_samples_per_client``), with
  the normal quantile of a counter hash of ``(seed, k)``: all 10^6 sizes in one vector op;
* the rest: ``numpy``'s Philox generator with key ``(seed, k)``, drawing ``u_k``, ``W_k``,
  ``b_k``, ``B_k``, ``v_k`` and then the ``n_k`` inputs, in that order. The first
  ``round(train_fraction * n_k)`` samples are the client's training set, the rest its test set.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fedforge.data.synthetic import check_synthetic, draw_samples, train_count

MASK64 = (1 << 64) - 1
SIZE_STREAM = 0x5123_A17E  # the counter hash's stream for client sizes
SHARED_ID = MASK64  # the Philox key of the model every client shares with iid=True
EVAL_STREAM = 0xE7A1  # the seed-sequence word of the evaluation sample (rounds use 2 words)
DEFAULT_EVAL_CLIENTS = 1000


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea and Flood 2014): a bijection of uint64 whose
    outputs look independent for consecutive inputs."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def counter_uniform(seed: int, stream: int, ids: np.ndarray) -> np.ndarray:
    """float64 in (0, 1) for each id: a hash of ``(seed, stream, id)``, no generator state."""
    with np.errstate(over="ignore"):
        key = _mix64(np.array([(seed ^ (stream << 32)) & MASK64], dtype=np.uint64))
        z = _mix64(np.asarray(ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def lognormal_sizes(seed: int, ids: np.ndarray, mean: float = 4.0, sigma: float = 2.0,
                    min_samples: int = 50, max_samples: int | None = None) -> np.ndarray:
    """int32 ``floor(LogNormal(mean, sigma)) + min_samples`` per id (capped), by quantile."""
    z = torch.special.ndtri(torch.from_numpy(counter_uniform(seed, SIZE_STREAM, ids))).numpy()
    sizes = np.floor(np.exp(mean + sigma * z)) + min_samples
    cap = np.iinfo(np.int32).max if max_samples is None else max_samples
    return np.minimum(sizes, cap).astype(np.int32)


@dataclass(frozen=True)
class SyntheticPopulation:
    """Synthetic(alpha, beta) with client ``k`` a function of ``(seed, k)`` only."""

    alpha: float = 1.0
    beta: float = 1.0
    num_clients: int = 1000
    dim: int = 60
    num_classes: int = 10
    seed: int = 0
    iid: bool = False
    train_fraction: float = 0.8
    max_samples_per_client: int | None = None

    def __post_init__(self) -> None:
        check_synthetic(self.alpha, self.beta, self.num_clients, self.dim, self.num_classes,
                        self.train_fraction, self.max_samples_per_client)

    def sizes(self, ids: np.ndarray | None = None) -> np.ndarray:
        """int32 samples (train + test) of clients ``ids`` (default: every client)."""
        ids = np.arange(self.num_clients) if ids is None else np.asarray(ids)
        return lognormal_sizes(self.seed, ids, max_samples=self.max_samples_per_client)

    def _generator(self, k: int) -> np.random.Generator:
        """Philox keyed by ``(seed, k)`` as two uint64 words (a Python list would go through
        int64, and ``SHARED_ID`` = 2^64 - 1 through a float cast, platform-dependent)."""
        key = np.array([self.seed & MASK64, k & MASK64], dtype=np.uint64)
        return np.random.Generator(np.random.Philox(key=key))

    def client(self, k: int, train_only: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
        """Client ``k``'s samples ``(x float32 [n, dim], y int64 [n], n_train)``, training
        samples first; ``train_only``: only those (the same values, the rest not drawn)."""
        if not 0 <= k < self.num_clients:
            raise IndexError(f"client {k} out of range for {self.num_clients} clients")
        n = int(self.sizes(np.array([k]))[0])
        g, c, d = self._generator(k), self.num_classes, self.dim
        if self.iid:
            shared = self._generator(SHARED_ID)
            w, b, v = shared.standard_normal((c, d)), shared.standard_normal(c), np.zeros(d)
        else:
            u = g.normal(0.0, self.alpha)
            w = u + g.standard_normal((c, d))
            b = u + g.standard_normal(c)
            v = g.normal(0.0, self.beta) + g.standard_normal(d)
        n_train = int(train_count(n, self.train_fraction))
        x, y = draw_samples(g, n_train if train_only else n, w, b, v)  # rows in order
        return x.astype(np.float32), y, n_train


class ClientCache:
    """The most recently used clients' samples, up to ``max_bytes`` (0: no cache)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.nbytes = max_bytes, 0
        self._items: OrderedDict[int, tuple[np.ndarray, np.ndarray, int]] = OrderedDict()

    def get(self, k: int, make) -> tuple[np.ndarray, np.ndarray, int]:
        if k in self._items:
            self._items.move_to_end(k)
            return self._items[k]
        item = make(k)
        size = item[0].nbytes + item[1].nbytes
        if size <= self.max_bytes:
            self._items[k] = item
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (x, y, _) = self._items.popitem(last=False)
                self.nbytes -= x.nbytes + y.nbytes
        return item

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class PopulationDataset:
    """A run's view of a population whose clients' data is generated when they are drawn.

    It answers what the runner asks of a :class:`fedforge.data.FederatedDataset`, with two
    differences: ``train_x``/``train_y`` hold the samples of the cohort last passed to
    :meth:`round_indices` (whose ids index into them), and ``test_x``/``test_y`` hold the test
    samples of the evaluation sample ``eval_clients``. The ``held_out`` highest client ids
    never train (:func:`sample_clients` draws from the others)."""

    source: SyntheticPopulation
    name: str = "synthetic_population"
    held_out: int = 0
    eval_clients: Tensor | None = None  # default: eval_sample(num_clients, None, held_out, 0)
    held_out_eval: Tensor | None = None  # the held-out clients evaluated (ids >= trainable)
    cache_bytes: int = 256 << 20
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    population = True
    vocab_size = None
    client_names = None

    def __post_init__(self) -> None:
        self._train_sizes = train_count(self.source.sizes(), self.source.train_fraction)
        self._sizes64: Tensor | None = None
        self._cache = ClientCache(self.cache_bytes)
        self._test: tuple[Tensor, Tensor, Tensor] | None = None
        self._held: tuple[Tensor, Tensor, Tensor] | None = None
        self.train_x = torch.zeros(0, self.source.dim, dtype=self.dtype, device=self.device)
        self.train_y = torch.zeros(0, dtype=torch.int64, device=self.device)
        check_held_out(self.held_out, self.num_clients)

    # --- what the runner reads -----------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return self.source.num_clients

    @property
    def trainable(self) -> int:
        """Clients ``0 .. trainable - 1`` may be drawn to train."""
        return self.num_clients - self.held_out

    @property
    def num_classes(self) -> int:
        return self.source.num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.source.dim,)

    def nbytes(self) -> int:
        """Bytes the population holds whatever the cohort (sizes; cached samples aside)."""
        held = self._train_sizes.nbytes
        return held + (0 if self._sizes64 is None else self._sizes64.numel() * 8)

    def client_sizes(self) -> Tensor:
        """int64 ``[num_clients]``: training samples per client (FedAvg weights)."""
        if self._sizes64 is None:
            self._sizes64 = torch.from_numpy(self._train_sizes.astype(np.int64))
        return self._sizes64.clone()

    def label_counts(self) -> None:
        """Not kept: counting labels would generate every client's data."""
        return None

    def to(self, device: torch.device | str) -> PopulationDataset:
        return self._copy(device=torch.device(device))

    def with_float_dtype(self, dtype: torch.dtype) -> PopulationDataset:
        return self._copy(dtype=dtype)

    def for_eval(self, clients: int | None, held_out: int, seed: int) -> PopulationDataset:
        """A copy that never trains its ``held_out`` highest ids and is evaluated on the
        sample :func:`eval_sample` draws (``eval.clients``, ``eval.held_out``, the run seed)."""
        check_held_out(held_out, self.num_clients)
        train, held = eval_sample(self.num_clients, clients, held_out, seed)
        return self._copy(eval_clients=train, held_out_eval=held, held_out=held_out)

    def _copy(self, **changes) -> PopulationDataset:
        """A shallow copy (sizes and cached samples shared: they depend on neither device nor
        dtype) with ``changes``; the cohort and the evaluation data are made afresh."""
        out = copy.copy(self)
        for key, value in changes.items():
            setattr(out, key, value)
        out._test = out._held = None
        out.train_x = self.train_x.to(out.device, out.dtype)
        out.train_y = self.train_y.to(out.device)
        return out

    # --- training data of a cohort -------------------------------------------------------
    def _client(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        return self._cache.get(k, lambda i: self.source.client(i, train_only=True))

    def round_indices(self, clients: Tensor, pos: Tensor) -> Tensor:
        """Generate the training samples of ``clients`` into ``train_x``/``train_y`` and map
        local positions ``pos`` ``[C, ...]`` to ids into them."""
        ids = clients.cpu().tolist()
        parts = [self._client(k) for k in ids]
        xs = [x[:n] for x, _, n in parts]
        ys = [y[:n] for _, y, n in parts]
        sizes = torch.tensor([n for _, _, n in parts], dtype=torch.int64)
        start = torch.cumsum(sizes, 0) - sizes
        dim = self.source.dim
        self.train_x = torch.from_numpy(np.concatenate(xs) if xs else np.zeros((0, dim),
                                        np.float32)).to(self.device, self.dtype)
        self.train_y = torch.from_numpy(np.concatenate(ys) if ys else np.zeros(0, np.int64)
                                        ).to(self.device)
        shape = (-1, *([1] * (pos.dim() - 1)))
        return (start.view(shape) + pos.cpu()).to(self.device)

    # --- test data ------------------------------------------------------------------------
    def test_data_of(self, client_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The test samples of ``client_ids``: ``(x, y, owner)``, ``owner`` int64 the client
        id of each sample (clients in the given order, their samples in their own order)."""
        xs, ys, owners = [], [], []
        for k in client_ids.cpu().tolist():
            x, y, n = self.source.client(k)  # evaluation samples stay out of the cache
            xs.append(x[n:])
            ys.append(y[n:])
            owners.append(np.full(len(y) - n, k, dtype=np.int64))
        if not xs:
            return (torch.zeros(0, self.source.dim, dtype=self.dtype, device=self.device),
                    torch.zeros(0, dtype=torch.int64, device=self.device),
                    torch.zeros(0, dtype=torch.int64, device=self.device))
        return (torch.from_numpy(np.concatenate(xs)).to(self.device, self.dtype),
                torch.from_numpy(np.concatenate(ys)).to(self.device),
                torch.from_numpy(np.concatenate(owners)).to(self.device))

    def _eval_data(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._test is None:
            ids = self.eval_clients
            if ids is None:
                ids = eval_sample(self.num_clients, None, self.held_out, 0)[0]
            self._test = self.test_data_of(ids)
        return self._test

    @property
    def test_x(self) -> Tensor:
        return self._eval_data()[0]

    @property
    def test_y(self) -> Tensor:
        return self._eval_data()[1]

    @property
    def client_test_indices(self) -> list[Tensor]:
        """Each evaluated client's test samples, as positions in ``test_x``."""
        owner = self._eval_data()[2]
        change = torch.nonzero(owner[1:] != owner[:-1]).flatten() + 1
        bounds = [0, *change.tolist(), owner.numel()]
        pos = torch.arange(owner.numel(), device=owner.device)
        return [pos[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]

    def held_out_data(self) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`test_data_of` the evaluated held-out clients (computed once)."""
        if self._held is None:
            ids = self.held_out_eval
            self._held = self.test_data_of(ids if ids is not None else torch.zeros(0))
        return self._held

    @property
    def test_clients(self) -> int:
        """How many clients the test metrics are measured on."""
        return len(self.eval_clients) if self.eval_clients is not None else min(
            DEFAULT_EVAL_CLIENTS, self.trainable)


def check_held_out(held_out: int, num_clients: int) -> None:
    """``eval.held_out``: the highest ids never drawn to train; at least one client trains."""
    if not 0 <= held_out < num_clients:
        raise ValueError(f"eval.held_out: expected 0 <= n < {num_clients} (the number of "
                         f"clients, one of which must train), got {held_out}")


def make_population(
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 1000,
    dim: int = 60,
    num_classes: int = 10,
    seed: int = 0,
    iid: bool = False,
    train_fraction: float = 0.8,
    max_samples_per_client: int | None = None,
    cache_mb: int = 256,
) -> PopulationDataset:
    """Procedural Synthetic(alpha, beta) over ``num_clients`` clients; ``cache_mb`` bounds the
    recently trained clients' samples kept between rounds (0: generate every time)."""
    if cache_mb < 0:
        raise ValueError(f"cache_mb must be >= 0, got {cache_mb}")
    source = SyntheticPopulation(alpha, beta, num_clients, dim, num_classes, seed, iid,
                                 train_fraction, max_samples_per_client)
    return PopulationDataset(source, cache_bytes=cache_mb << 20)


def sample_clients(population: int, k: int, generator: torch.Generator) -> Tensor:
    """``k`` distinct ids of ``range(population)``, sorted, in O(k) time and memory.

    Floyd's algorithm (Bentley and Floyd 1987): for ``j = population - k .. population - 1``
    draw ``t`` uniform in ``[0, j]`` and take ``t``, or ``j`` if ``t`` was taken already; every
    k-subset is equally likely. The ``k`` uniforms are the generator's next ``k`` float64
    draws, so the cohort is a function of the generator's seed (a different draw from the
    ``randperm`` of datasets that hold every client)."""
    if not 0 <= k <= population:
        raise ValueError(f"cannot draw {k} distinct clients of {population}")
    u = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
    taken: set[int] = set()
    for i, j in enumerate(range(population - k, population)):
        t = min(int(u[i] * (j + 1)), j)
        taken.add(j if t in taken else t)
    return torch.tensor(sorted(taken), dtype=torch.int64)


def eval_sample(num_clients: int, clients: int | None, held_out: int, seed: int
                ) -> tuple[Tensor, Tensor]:
    """The clients a population run is evaluated on, fixed for the run:
    ``(training ids, held-out ids)``. ``clients`` (default 1000) of the ``num_clients -
    held_out`` training clients and ``min(clients, held_out)`` of the held-out ones (the
    ``held_out`` highest ids), each drawn by :func:`sample_clients` from ``(seed, EVAL_STREAM)``."""
    trainable = num_clients - held_out
    want = DEFAULT_EVAL_CLIENTS if clients is None else clients
    state = np.random.SeedSequence([seed & MASK64, EVAL_STREAM, 0]).generate_state(1)[0]
    gen = torch.Generator().manual_seed(int(state))
    train = sample_clients(trainable, min(want, trainable), gen)
    held = sample_clients(held_out, min(want, held_out), gen) + trainable
    return train, held
