"""Checkpoint state of the drivers: tensors (models, buffers, versions in flight) + JSON meta.

Results computed but not yet arrived are saved too: a job's result is a pure function of the
model version it was sent, its client and its seed, but recomputed in another batch of jobs
it may differ in the last bits, and a resumed run must equal the uninterrupted one exactly.
"""

from __future__ import annotations

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
        for m, s in enumerate(d.stores):
            tensors[f"task{m}"]["store"] = s.state_dict()
    return tensors, meta


def load_driver_state(d: AsyncDriver | SyncDriver, tensors: dict, meta: dict) -> None:
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
        for m, s in enumerate(d.stores):
            flat = tensors[f"task{m}"].get("store", {})
            if flat:
                s.load_state_dict(flat)
