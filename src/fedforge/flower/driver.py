"""The Flower server as a driver of the one run loop (:func:`fedforge.experiment.runner.drive`).

A deployment's rounds go through the loop every run goes through: the run folder is claimed
and locked, each round's record goes to ``metrics.jsonl``, the model and the server state
are checkpointed every ``checkpoint.every`` rounds and at the last, and ``resume`` continues
from the last checkpoint, so a ServerApp killed mid-run and started again with ``resume``
ends with the model and the records of an uninterrupted run. What one round does (sample,
send, screen, aggregate, guard) is :mod:`fedforge.flower.server`'s.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from flwr.serverapp import Grid

from fedforge.core.tree import Params, restore_like, tree_nbytes
from fedforge.experiment.build import resolve_config
from fedforge.experiment.config import RunConfig
from fedforge.experiment.drivers import RunFolder, Show, run_folder
from fedforge.experiment.runner import Experiment, drive
from fedforge.experiment.state import RunState
from fedforge.flower.common import experiment, logger
from fedforge.flower.server import (
    PartitionMap,
    ServerOptions,
    ServerView,
    aggregate_step,
    check_supported,
    reply_template,
    round_line,
    round_targets,
    screen_replies,
    server_update,
    test_metrics,
    train_loss,
    train_message,
    wait_for_nodes,
)
from fedforge.robust.divergence import DivergenceError

OnRound = Callable[[int, Params, dict], None]
"""``on_round(t, params, info)``: sees each round's replies, byte counts and guards."""

RESUMABLE_OPTIONS = ("round_timeout", "query_timeout", "eval_every")
"""The server options a resume may change: they decide how long a round waits and which
rounds are evaluated, not which replies count."""


def flower_config(cfg: RunConfig, options: ServerOptions) -> RunConfig:
    """``cfg`` with every default written out, as the run folder records it. Under Flower's
    standard messages an unset ``server.aggregation`` is uniform: the server weighs the
    replies by ``num-examples`` only when asked to."""
    resolved = resolve_config(cfg)
    if options.protocol != "flower":
        return resolved
    server = resolved.server.model_copy(
        update={"aggregation": cfg.server.aggregation or "uniform"})
    return resolved.model_copy(update={"server": server})


class FlowerDriver:
    """Synchronous rounds over a Flower ``Grid``: the nodes train, the server screens their
    replies and steps (:mod:`fedforge.flower.server`). Its checkpoint holds the model and
    the server state; each node's client state lives on the node, so only an algorithm
    without client state resumes (:meth:`load_state_dict` refuses the others)."""

    def __init__(self, grid: Grid, exp: Experiment, options: ServerOptions, folder: RunFolder,
                 *, on_round: OnRound | None = None) -> None:
        self.grid, self.exp, self.options, self.folder = grid, exp, options, folder
        self.on_round = on_round
        self.cfg, self.device = exp.cfg, exp.device
        self.state = RunState(seed=self.cfg.seed)
        self._loaded: dict | None = None

    def load_state_dict(self, tensors: dict, state: RunState) -> None:
        where = self.folder.checkpoints / f"round_{state.round:05d}.json"
        state.check_algorithm(self.cfg.algorithm.name, where)
        check_options(state.flower or {}, self.options, where)
        if "client_state" in self.exp.algorithm.needs(self.exp.initial_params()):
            raise ValueError(f"{where}: algorithm {self.cfg.algorithm.name!r} keeps per-client "
                             "state on the nodes (Flower's context.state of the run that "
                             "stopped), which a new run does not have; a Flower deployment "
                             "resumes only algorithms without client state")
        self._loaded, self.state = tensors, state

    def start(self) -> None:
        exp = self.exp
        check_supported(exp, self.options)
        initial = server_update(exp, exp.initial_params(), None)
        if self.options.protocol == "flower":
            self.template = {"arrays": {k: v.cpu() for k, v in initial.params.items()}}
            self.nodes = None
        else:
            self.template = reply_template(exp, initial)
            self.nodes = PartitionMap(exp.data.num_clients)
        self.view = initial if self._loaded is None else self._restore(self._loaded)
        self._loaded = None
        self.t0 = time.perf_counter() - self.state.wall_s

    def _restore(self, tensors: dict) -> ServerView:
        """The checkpoint's model and server state, rebuilt in the order of a fresh init."""
        template = self.exp.initial_params()
        params = restore_like(template, tensors["params"], "params")
        state = self.exp.algorithm.server.restore(template, tensors.get("server", {}))
        return server_update(self.exp, params, state, round_=self.state.round)

    def step(self) -> list[dict]:
        exp, options, grid, s = self.exp, self.options, self.grid, self.state
        t = s.round + 1
        wait_for_nodes(grid, options.min_replies, options.query_timeout)
        info: dict = {"rejected": [], "skipped": None, "rolled_back": False}
        if self.nodes is not None:
            info["refused_nodes"] = self.nodes.refresh(grid, options.query_timeout, t)
        targets = round_targets(exp, grid, self.nodes, t)
        msgs = [train_message(self.view, tg, t, options) for tg in targets]
        replies = grid.send_and_receive(msgs, timeout=options.round_timeout) if msgs else []
        accepted = screen_replies(replies, targets, self.template, self.view, options, info,
                                  t, relative_delta=exp.algorithm.codec is None, msgs=msgs)
        info["asked"], info["nodes"] = len(msgs), len(list(grid.get_node_ids()))
        info["accepted"] = [r.target.node if self.nodes is None else r.target.client
                            for r in accepted]
        info["bytes_down"] = self.view.bytes_down * len(msgs)
        info["bytes_up"] = self.view.bytes_up * len(accepted)
        info["array_bytes_up"] = sum(tree_nbytes(r.delta) + tree_nbytes(r.uploads)
                                     for r in accepted)
        self.state = replace(s, round=t, bytes_up=s.bytes_up + info["bytes_up"],
                             bytes_down=s.bytes_down + info["bytes_down"])
        info.update(bytes_up_total=self.state.bytes_up, bytes_down_total=self.state.bytes_down)
        self.view = aggregate_step(exp, self.view, accepted, options, info, t)
        info["train_loss"] = train_loss(accepted)
        info.update(test_metrics(exp, self.view.params, self.view.state, t, options.eval_every))
        if self.on_round is not None:
            self.on_round(t, self.view.params, info)
        return [{"round": t, **info, "wall_s": round(time.perf_counter() - self.t0, 3)}]

    def finished(self) -> bool:
        return self.state.round >= self.cfg.rounds

    def checkpoint_due(self) -> bool:
        t = self.state.round
        return t % self.cfg.checkpoint.every == 0 or t == self.cfg.rounds

    def state_dict(self) -> tuple[dict, RunState]:
        state = replace(self.state, wall_s=time.perf_counter() - self.t0, seed=self.cfg.seed,
                        algorithm=self.cfg.algorithm.name, flower=asdict(self.options))
        return {"params": self.view.params, "server": self.view.state.tree()}, state

    def checkpointed(self) -> None:
        """Nothing to tidy: the checkpoint holds no client rows."""

    def rollback(self, error: DivergenceError) -> bool:
        return False  # a non-finite server step is undone by the round's own guard

    @contextmanager
    def progress(self) -> Iterator[Show]:
        """One log line per round (what ``flwr run --stream`` shows)."""
        def show(records: list[dict]) -> None:
            for r in records:
                logger.info(round_line(r["round"], self.cfg.rounds, r))

        yield show

    def summarise(self) -> None:
        """The last round is checkpointed; the caller saves the final model."""

    def __enter__(self) -> FlowerDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def check_options(saved: dict, options: ServerOptions, where: object) -> None:
    """Refuse, in one line naming the option, a resume whose server options decide
    differently which replies count than the checkpointed run's did."""
    for name, value in asdict(options).items():
        if name in saved and name not in RESUMABLE_OPTIONS and saved[name] != value:
            raise ValueError(f"{where}: server option {name} is {value!r}, the run was started "
                             f"with {saved[name]!r}; a resume may change only "
                             f"{', '.join(RESUMABLE_OPTIONS)}")


def run_server(grid: Grid, cfg: RunConfig, options: ServerOptions | None = None, *,
               on_round: OnRound | None = None, out_dir: str | Path | None = None,
               resume: bool = False, overwrite: bool = False) -> Params:
    """Run ``cfg`` over ``grid`` through the one run loop -> the final model.

    ``out_dir``: the run folder (``config.resolved.toml``, ``metrics.jsonl``,
    ``checkpoints/``), claimed as ``fedforge run --out`` claims it: one that holds a run
    needs ``resume`` (continue from its last checkpoint) or ``overwrite``. Without it the run
    writes into a temporary folder, deleted at the end."""
    options = options or ServerOptions()
    if out_dir is None:
        with tempfile.TemporaryDirectory(prefix="fedforge-flower-") as tmp:
            return run_server(grid, cfg, options, on_round=on_round, out_dir=tmp)
    cfg = flower_config(cfg, options)
    folder = run_folder(cfg, out_dir)
    drivers: list[FlowerDriver] = []

    def build() -> FlowerDriver:
        exp, _ = experiment(cfg)
        drivers.append(FlowerDriver(grid, exp, options, folder, on_round=on_round))
        return drivers[0]

    drive(cfg, folder, build, resume=resume, overwrite=overwrite)
    return drivers[0].view.params
