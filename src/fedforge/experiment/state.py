"""The typed state of a run: every counter a checkpoint carries, written and read in one place.

A run counts rounds (one task in synchronous rounds) or client updates (several tasks on
one clock); :class:`RunState` holds the counters of either, and resume, rollback and
checkpoint go through :meth:`RunState.to_meta` and :meth:`RunState.from_meta` only. A
checkpoint whose fields are missing or reshaped is refused in one line naming it, as the
server chain refuses a reshaped server state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ROUND, UPDATES = "round", "updates"
"""The units a run counts: its ``RunState.round`` is rounds done or client updates applied."""

RNG_NOTE = "derived per round from (seed, round)"
"""Written into synchronous checkpoints: there is no generator state to restore."""

_NUMBER, _INT, _TABLE, _TEXT = "a number", "an integer", "a table", "a string"
_FIELDS = {  # name: (kind, required); the order is the checkpoint JSON's
    ROUND: {"wall_s": (_NUMBER, True), "bytes_up": (_INT, True), "bytes_down": (_INT, True),
            "seed": (_INT, False), "prep_s": (_NUMBER, True), "sim_time_s": (_NUMBER, True),
            "sim_clock": (_TABLE, False), "lr_scale": (_NUMBER, True),
            "rollbacks": (_INT, True), "engine": (_TABLE, False), "privacy": (_TABLE, False),
            "store": (_TABLE, False), "algorithm": (_TEXT, False),
            "flower": (_TABLE, False)},
    UPDATES: {"driver": (_TABLE, True), "wall_s": (_NUMBER, True), "seed": (_INT, False)},
}

# written only when set: a null one was put there by hand (a null ledger or store record would
# restart the accounting or the disk store without a word)
_ABSENT_WHEN_NONE = ("privacy", "store", "algorithm", "flower")


@dataclass(frozen=True)
class RunState:
    """The counters of a run between two steps (replaced, never changed in place).

    ``round``: rounds done, or client updates applied when ``unit`` is ``"updates"``;
    ``sim_clock``: the straggler clock's queue tails; ``engine``: the engine's recorded
    choices (``auto``, ``procs``); ``privacy``: the privacy ledger; ``store``: the client
    store's checkpoint record (:meth:`fedforge.core.store.StateStore.checkpoint`: the disk
    store's committed version and segments; absent for the in-memory store, whose rows are
    the checkpoint's ``clients`` tensors); ``driver``: a multi-task scheduler's own state,
    what its :meth:`fedforge.schedulers.scheduler.Scheduler.state_dict` returns (clock,
    allocation, tasks); ``algorithm``: the ``algorithm.name`` that wrote the checkpoint
    (see :meth:`check_algorithm`); ``flower``: a Flower server's options
    (:class:`fedforge.flower.server.ServerOptions`), checked on resume."""

    round: int = 0
    wall_s: float = 0.0
    seed: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    sim_time_s: float = 0.0
    prep_s: float = 0.0
    lr_scale: float = 1.0
    rollbacks: int = 0
    sim_clock: dict | None = None
    engine: dict = field(default_factory=dict)
    privacy: dict | None = None
    store: dict | None = None
    driver: dict | None = None
    algorithm: str | None = None
    flower: dict | None = None
    unit: str = ROUND

    def __post_init__(self) -> None:
        if self.unit not in _FIELDS:
            raise ValueError(f"unit: expected one of {list(_FIELDS)}, got {self.unit!r}")

    def to_meta(self) -> dict:
        """The checkpoint JSON's fields (``round`` is added by the checkpoint writer)."""
        meta = {name: getattr(self, name) for name in _FIELDS[self.unit]}
        for name in _ABSENT_WHEN_NONE:
            if meta.get(name, 0) is None:
                del meta[name]
        return {**meta, "rng": RNG_NOTE} if self.unit == ROUND else meta

    @classmethod
    def from_meta(cls, meta: dict, where: object, unit: str = ROUND) -> RunState:
        """The state a checkpoint's JSON ``meta`` (read from ``where``) recorded; ValueError in
        one line naming ``where`` and the field that is missing or of the wrong kind."""
        if unit not in _FIELDS:
            raise ValueError(f"unit: expected one of {list(_FIELDS)}, got {unit!r}")
        _check(meta, ROUND, _INT, True, where)
        for name, (kind, required) in _FIELDS[unit].items():
            _check(meta, name, kind, required, where)
        if unit == ROUND and not 0 < meta["lr_scale"] < math.inf:  # a factor of the local lr
            raise ValueError(f"{where}: checkpoint field 'lr_scale' must be a positive, finite "
                             f"number, got {meta['lr_scale']!r}")
        kept = {name: meta[name] for name in _FIELDS[unit] if meta.get(name) is not None}
        return cls(round=meta[ROUND], unit=unit, **kept)

    def check_algorithm(self, name: str, where: object) -> None:
        """Refuse to continue the checkpoint read from ``where`` under algorithm ``name`` if
        another one wrote it: two methods' client states can share leaf names and shapes
        (FedPer's and FedRep's personal heads) and would load without a word. A checkpoint
        that records no algorithm (written before the field existed) is accepted as before:
        a resume already refuses a config whose ``algorithm.name`` differs from the run's."""
        if self.algorithm is not None and self.algorithm != name:
            raise ValueError(f"{where}: a checkpoint of algorithm {self.algorithm!r}, not of "
                             f"this run's {name!r}; choose another --out or pass --overwrite")

    def covers(self, record: dict) -> bool:
        """Whether a record of the run's log is of a step this state includes (a resumed or
        rolled-back run keeps those and drops the rest)."""
        return record[self.unit] <= self.round


def _check(meta: dict, name: str, kind: str, required: bool, where: object) -> None:
    value = meta.get(name)
    if value is None and name in meta and name in _ABSENT_WHEN_NONE:  # never written as null:
        raise ValueError(f"{where}: checkpoint field {name!r} is null; a checkpoint that has "
                         "none leaves the field out")
    if value is None and not required:
        return
    if kind == _TABLE:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: checkpoint field {name!r} is "
                             f"{'missing' if value is None else 'not a table'} ({value!r})")
        return
    types = int if kind == _INT else str if kind == _TEXT else (int, float)
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"{where}: checkpoint field {name!r} is missing or not {kind} "
                         f"({value!r})")
