"""Checkpoint state of the drivers: tensors (models, buffers, versions in flight) + JSON meta.

Results computed but not yet arrived are saved too: a job's result is a pure function of the
model version it was sent, its client and its seed, but recomputed in another batch of jobs
it may differ in the last bits, and a resumed run must equal the uninterrupted one exactly.

The synchronous driver's client stores: a memory store's rows are tensors of the checkpoint
(``task<m>/store``); a disk store writes the rows changed since the last checkpoint as a
segment of its own folder, and the meta's ``"stores"`` records, per task, the segments that
rebuild it (``None`` for a task in memory; the key is absent when no task is on disk).
"""

from __future__ import annotations

from collections.abc import Iterable

from fedforge.core.disk_store import DiskClientStore
from fedforge.core.tree import tree_clone
from fedforge.sim.fedast import AsyncDriver
from fedforge.sim.multitask_sync import SyncDriver


def _rng_state(rng) -> dict:
    st = rng.bit_generator.state
    return {"bit_generator": st["bit_generator"], "state": {k: str(v) for k, v in
                                                            st["state"].items()},
            "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}


def _set_rng(rng, saved: dict) -> None:
    rng.bit_generator.state = {
        "bit_generator": saved["bit_generator"],
        "state": {k: int(v) for k, v in saved["state"].items()},
        "has_uint32": saved["has_uint32"], "uinteger": saved["uinteger"],
    }


def _task_meta(t) -> dict:
    return {**t.server.meta(), "done": t.done, "done_time": t.done_time, "losses": t.losses}


def _load_task(t, tensors: dict, meta: dict) -> None:
    t.server.load(tensors, meta)
    t.done, t.done_time, t.losses = meta["done"], meta["done_time"], list(meta["losses"])


def driver_state(d: AsyncDriver | SyncDriver) -> tuple[dict, dict]:
    tensors, meta = {}, {"c": d.c, "rng": _rng_state(d.rng), "clock": d.clock.state_dict(),
                         "delay": d.delay.state_dict(),
                         "tasks": [_task_meta(t) for t in d.tasks]}
    for m, t in enumerate(d.tasks):
        tensors[f"task{m}"] = t.server.state_dict()
    if isinstance(d, AsyncDriver):
        meta.update(R=d.R, cur=d.cur, since_realloc=d.since_realloc, alloc_log=d.alloc_log)
        if d.code is not None:
            meta["code"] = d.code.state_dict()
        for m, t in enumerate(d.tasks):
            # by version, so a resumed run writes the same file; clones: may alias params
            versions = sorted(t.executor.versions.items(), key=lambda item: item[0])
            tensors[f"task{m}"]["versions"] = {
                f"v{v}": {"params": tree_clone(p), "bcast": tree_clone(b)}
                for v, (p, b) in versions}
            deltas, losses = t.executor.computed()
            tensors[f"task{m}"]["results"] = deltas
            meta["tasks"][m]["results"] = losses
            tensors[f"task{m}"]["window"] = {f"w{i}": w for i, w in enumerate(d.window[m])}
    else:
        meta.update(round=d.round, first_loss=d.first_loss, last_loss=d.last_loss,
                    assigned=d.assigned)
        records = []
        for m, s in enumerate(d.stores):
            if isinstance(s, DiskClientStore):  # version: the updates so far, which grow
                records.append(s.record(d.c))
            else:
                records.append(None)
                tensors[f"task{m}"]["store"] = s.state_dict()
        if any(r is not None for r in records):
            meta["stores"] = records
    return tensors, meta


def restore_stores(d: SyncDriver, records: list | None, where: object = "checkpoint") -> None:
    """Each task's store at a checkpoint's ``"stores"`` records (None: a memory store, or no
    checkpoint), rebuilt as the kind the checkpoint holds; a disk store in a fresh run
    (``records`` None) drops the rows and segments an earlier run left in its folder."""
    fresh = records is None
    records = records if isinstance(records, list) else [None] * len(d.stores)
    if len(records) != len(d.stores):
        raise ValueError(f"{where}: \"stores\" has {len(records)} entries for "
                         f"{len(d.stores)} tasks")
    for m, rec in enumerate(records):
        disk = isinstance(d.stores[m], DiskClientStore)
        if not fresh and disk != (rec is not None):
            d.stores[m] = d.new_store(m, "disk" if rec is not None else "memory")
        if isinstance(d.stores[m], DiskClientStore):  # committed at the checkpoint's d.c
            d.stores[m].restore_record(rec, where, version=None if fresh else d.c)


def collect_stores(d: SyncDriver, metas: Iterable[dict]) -> None:
    """Delete the disk stores' segments that none of the kept checkpoints' driver ``metas``
    names."""
    metas = list(metas)
    for m, s in enumerate(d.stores):
        if isinstance(s, DiskClientStore):
            recs = [meta["stores"][m] for meta in metas
                    if isinstance(meta.get("stores"), list) and len(meta["stores"]) > m]
            s.collect(s.referenced(recs))


def load_driver_state(d: AsyncDriver | SyncDriver, tensors: dict, meta: dict,
                      where: object = "checkpoint") -> None:
    d.c = meta["c"]
    _set_rng(d.rng, meta["rng"])
    d.clock.load_state_dict(meta["clock"])
    d.delay.load_state_dict(meta["delay"])
    for m, t in enumerate(d.tasks):
        tt = tensors[f"task{m}"]
        _load_task(t, {"params": tt["params"], "server": tt.get("server", {}),
                       "buf_sum": tt["buf_sum"]}, meta["tasks"][m])
    if isinstance(d, AsyncDriver):
        d.R, d.cur, d.since_realloc = list(meta["R"]), list(meta["cur"]), meta["since_realloc"]
        d.alloc_log = [tuple(x) for x in meta["alloc_log"]]
        if d.code is not None:
            d.code.load_state_dict(meta["code"])
        for m, t in enumerate(d.tasks):
            tt = tensors[f"task{m}"]
            versions = tt.get("versions", {})
            win = tt.get("window", {})
            d.window[m] = [win[f"w{i}"] for i in range(len(win))]
            deltas, losses = tt.get("results", {}), meta["tasks"][m].get("results", {})
            for job in d.clock.pending(m):
                v = versions[f"v{job.version}"]
                key = f"j{job.job_id}"
                t.executor.restore(job, v["params"], {"round": v["bcast"]["round"],
                                                      **{k: x for k, x in v["bcast"].items()
                                                         if k != "round"}},
                                   deltas.get(key), losses.get(key))
    else:
        d.round, d.assigned = meta["round"], list(meta["assigned"])
        d.first_loss, d.last_loss = list(meta["first_loss"]), list(meta["last_loss"])
        records = meta.get("stores", [None] * len(d.stores))  # absent: every task in memory
        if not isinstance(records, list):  # None would start the tasks' disk stores afresh
            raise ValueError(f"{where}: \"stores\" must be a list of each task's store "
                             f"record, got {type(records).__name__}")
        restore_stores(d, records, where)
        for m, s in enumerate(d.stores):
            flat = tensors[f"task{m}"].get("store", {})
            if flat and not isinstance(s, DiskClientStore):
                s.load_state_dict(flat)
