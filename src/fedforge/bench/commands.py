"""The ``fedforge bench`` group: one command per workload, its module imported only when the
command runs (or ``fedforge bench --help`` lists them), so the other commands start without
it. Each command is a function of its workload's module whose parameters are its options
(:mod:`fedforge.bench.options`); it returns the table it recorded, which the group prints.
A ``ValueError`` or ``OSError`` (a bad option, a missing file) is a one-line error."""

from __future__ import annotations

from importlib import import_module

import click
import typer
from typer.core import TyperGroup

from fedforge.commands.output import failing, print_wide

BENCHES = {"w1": "throughput:w1", "w2": "throughput:w2", "w3": "time_to_accuracy:w3",
           "population": "population:population", "pfl-cifar10": "pfl_cifar10:pfl_cifar10",
           "pfl-ditto": "pfl_speed:pfl_ditto", "lora": "lora:lora",
           "results": "results:results"}
"""``fedforge bench NAME`` -> ``module:function`` in ``fedforge.bench``: the function's
parameters are the command's options."""


class Workloads(TyperGroup):
    """The workloads as the commands of one group, each built when it is asked for."""

    def invoke(self, ctx: click.Context) -> None:
        with failing(ValueError, OSError):
            table = super().invoke(ctx)
        print_wide(table, markup=False)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(BENCHES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in BENCHES:
            return None
        module, function = BENCHES[cmd_name].split(":")
        workload = typer.Typer(add_completion=False)
        workload.command(cmd_name)(getattr(import_module(f"fedforge.bench.{module}"),
                                           function))
        return typer.main.get_command(workload)
