"""One row of ``fedforge bench lora`` (one framework, cohort and precision) in its own process.

``python -m fedforge.bench.lora_run SPEC OUT`` reads the spec the parent wrote
(:mod:`fedforge.bench.lora`), builds the cohort's random token batches, starts from the
initial adapters the parent saved, runs the warm-up and timed FedAvg rounds with the named
framework and writes ``OUT`` (JSON: seconds of each round, what ran, memory) and
``OUT.safetensors`` (the global adapters after the last round, which the parent compares
across frameworks). Each row is its own process so that its memory high-water mark
(``VmHWM``) is its own.

* ``fedforge``: ``model.name = "pretrained"`` (one frozen base, the cohort's adapters) and
  fedforge's ``fedavg`` through ``federated_round``, with the engine a config without an
  ``[engine]`` section gets (``auto``, worker processes allowed, as the ``fedforge``
  command);
* ``plain``: the per-client loop a user writes with transformers and PEFT: one
  ``PeftModel`` (``get_peft_model`` with LoRA's settings), and for each client in turn the
  global adapters copied in, ``torch.optim.SGD`` over the trainable parameters, mean
  cross-entropy on the model's logits with the padding mask, then the client's adapters
  added to the average. In bf16 the base is loaded in bf16 (PEFT keeps the adapters in
  float32) and the head is kept in float32, as fedforge's ``precision = "bf16"`` does.

Both rows run the model in eval mode, without dropout (the base's dropout layers draw from
different generators in the two), so that they compute the same rounds and the parent can
check it; dropout's masks cost both alike.
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from fedforge.bench.pfl_cifar10_run import Clock

RUN_ROUNDS = 100  # the run auto's calibration is sized for (rounds x cohort client updates)
PRECISIONS = {"fp32": "float32", "bf16": "bf16"}  # the bench's name -> model.options.precision


@dataclass(frozen=True)
class LoraWork:
    """The workload: LoRA on ``target`` linears of a local classifier, FedAvg rounds in
    which every client takes ``steps`` SGD steps on batches of ``batch`` sequences of
    ``max_len`` tokens (random lengths from 2 up, padded)."""

    path: str
    steps: int = 4
    batch: int = 16
    max_len: int = 64
    r: int = 8
    alpha: int = 16
    target: tuple[str, ...] = ("query", "value")
    lr: float = 0.05
    classes: int = 2
    seed: int = 0

    @property
    def adapters(self) -> dict:
        """``model.options.adapters`` (PEFT's LoraConfig names)."""
        return {"r": self.r, "lora_alpha": self.alpha, "target_modules": list(self.target)}

    def lora_config(self) -> Any:
        """The same settings as PEFT's own ``LoraConfig`` (for the plain loop)."""
        peft = pretrained_extra()[1]
        return peft.LoraConfig(task_type="SEQ_CLS", r=self.r, lora_alpha=self.alpha,
                               lora_dropout=0.0, target_modules=list(self.target))


def pretrained_extra() -> tuple[Any, Any]:
    """transformers and peft, or a one-line refusal naming the extra that installs them."""
    try:
        import peft
        import transformers
    except ImportError:
        raise SystemExit("bench lora: needs the extra: pip install 'fedforge[pretrained]'"
                         ) from None
    return transformers, peft


def work_of(spec: dict) -> LoraWork:
    """The spec's workload (JSON turned the target tuple into a list)."""
    fields = dict(spec["work"])
    return LoraWork(**{**fields, "target": tuple(fields["target"])})


def model_tokens(path: str) -> tuple[int, int]:
    """(vocabulary size, padding id) of a local model folder's ``config.json``."""
    from fedforge.models.pretrained import resolve_source

    config = json.loads((resolve_source(path).folder / "config.json").read_text())
    pad = config.get("pad_token_id")
    return int(config["vocab_size"]), 0 if pad is None else int(pad)


def make_batches(work: LoraWork, cohort: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The cohort's data, the same in every framework: token ids ``x`` [N, T] (random
    non-padding ids, each sequence 2..T long, padded), labels ``y`` [N] and client ``c``'s
    step ``s`` batch as rows ``idx[c, s]`` [K, S, B]; and the padding id."""
    vocab, pad = model_tokens(work.path)
    g = torch.Generator().manual_seed(work.seed)
    n, t = cohort * work.steps * work.batch, work.max_len
    ids = torch.randint(0, vocab - 1, (n, t), generator=g)
    ids = ids + (ids >= pad).long()  # never the padding id
    lengths = torch.randint(2, t + 1, (n,), generator=g)
    x = torch.where(torch.arange(t) < lengths[:, None], ids, pad)
    y = torch.randint(0, work.classes, (n,), generator=g)
    return x, y, torch.arange(n).view(cohort, work.steps, work.batch), pad


def fedforge_model(work: LoraWork, precision: str) -> nn.Module:
    """fedforge's LoRA model of the workload (seeded: its leaves are the initial adapters)."""
    from fedforge.models import build_model

    torch.manual_seed(work.seed)
    model = build_model("pretrained", (work.max_len,), work.classes, path=work.path,
                        precision=PRECISIONS[precision], adapters=work.adapters)
    return model.eval()  # no dropout (see the module docstring)


# --- the plain PEFT loop --------------------------------------------------------------------


def plain_model(work: LoraWork, precision: str, start: dict[str, torch.Tensor]
                ) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    """The PEFT model over the base (in bf16 for ``bf16``, head in float32) holding the
    adapters ``start`` (fedforge's leaf names) -> (model, its trainable parameters by
    fedforge's leaf names)."""
    from fedforge.models.lora import HEAD_MODULES, to_peft
    from fedforge.models.pretrained import load_hf_model

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    base = load_hf_model(work.path, "classification", work.classes, dtype=dtype)
    model = to_peft(base, work.lora_config(), start, "classification")
    for name, module in model.named_modules():  # the head's trained copy in float32
        if name.endswith(".modules_to_save.default") and name.split(".")[-3] in HEAD_MODULES:
            module.float()
            module.register_forward_pre_hook(lambda _m, args: (args[0].float(), *args[1:]))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    by_leaf = _by_leaf(list(start), list(trainable))
    params = {leaf: trainable[peft_name] for leaf, peft_name in by_leaf.items()}
    with torch.no_grad():
        for leaf, p in params.items():
            p.copy_(start[leaf])
    return model, params


def _by_leaf(leaves: list[str], peft_names: list[str]) -> dict[str, str]:
    """fedforge's leaf name -> PEFT's parameter name (the one PEFT exports it under)."""
    from fedforge.models.lora import HEAD_MODULES, PREFIX, _peft_name

    heads = sorted({n.removeprefix(PREFIX).split(".")[0] for n in leaves
                    if n.removeprefix(PREFIX).split(".")[0] in HEAD_MODULES})
    out = {leaf: _peft_name(leaf, heads) for leaf in leaves}
    missing = sorted(set(out.values()) - set(peft_names))
    if missing:
        raise RuntimeError(f"plain loop: PEFT's model has no parameter {missing[0]!r}")
    return out


def plain_round(model: nn.Module, params: dict[str, nn.Parameter],
                global_leaves: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                idx: torch.Tensor, pad: int, lr: float,
                losses: list[list[float]] | None = None) -> dict[str, torch.Tensor]:
    """One FedAvg round of the plain loop: each client starts from ``global_leaves``, takes
    SGD steps on its batches ``idx[c]``, and the clients' adapters are averaged (equal
    sizes). ``losses``: each client's step losses are appended to it."""
    mean = {k: torch.zeros_like(v) for k, v in global_leaves.items()}
    model.eval()  # no dropout (see the module docstring)
    for c in range(idx.shape[0]):
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(global_leaves[k])
        opt = torch.optim.SGD(params.values(), lr=lr)
        mine = []
        for b in idx[c]:
            opt.zero_grad(set_to_none=True)
            tokens = x[b]
            logits = model(input_ids=tokens, attention_mask=(tokens != pad).long()).logits
            loss = F.cross_entropy(logits.float(), y[b])
            loss.backward()
            opt.step()
            mine.append(float(loss.detach()))
        if losses is not None:
            losses.append(mine)
        for k, p in params.items():
            mean[k] += p.detach() / idx.shape[0]
    return mean


def run_plain(spec: dict, work: LoraWork, data: tuple, clock: Clock) -> tuple[dict, str]:
    x, y, idx, pad = data
    start = load_file(spec["init"])
    model, params = plain_model(work, spec["precision"], start)
    leaves = dict(start)
    clock.stamp()
    for _ in range(spec["warmup"] + spec["iterations"]):
        leaves = plain_round(model, params, leaves, x, y, idx, pad, work.lr)
        clock.stamp()
    return leaves, f"per-client PEFT loop, {torch.get_num_threads()} threads"


# --- fedforge -------------------------------------------------------------------------------


def run_fedforge(spec: dict, work: LoraWork, data: tuple, clock: Clock) -> tuple[dict, str]:
    """fedforge's FedAvg over the LoRA model through ``federated_round``, with the engine a
    config without an ``[engine]`` section gets from the ``fedforge`` command."""
    from fedforge.algorithms import build_algorithm
    from fedforge.core.store import ClientStore
    from fedforge.engine import classification_loss
    from fedforge.engine.build import build_engine
    from fedforge.engine.draw import RoundDraw
    from fedforge.engine.round import RoundSetup, federated_round
    from fedforge.experiment.config import EngineConfig

    x, y, idx, _ = data
    cohort = idx.shape[0]
    model = fedforge_model(work, spec["precision"])
    params = load_file(spec["init"])
    algo = build_algorithm("fedavg", local_lr=work.lr)
    engine = build_engine(EngineConfig(), allow_processes=True,
                          budget_updates=RUN_ROUNDS * cohort)
    server = algo.server_init(params)
    setup = RoundSetup(algo, engine, classification_loss(model, "fp32"),
                       ClientStore(cohort, algo.client_init(params)), x, y)
    ids, weights = torch.arange(cohort), torch.ones(idx.shape)
    try:
        clock.stamp()
        for t in range(1, spec["warmup"] + spec["iterations"] + 1):
            res = federated_round(setup, params, server,
                                  RoundDraw(ids, idx, weights, round=t).with_keys(work.seed))
            params, server = res.params, res.server_state
            clock.stamp()
        label = engine.report().get("engine_auto", "auto")
    finally:
        engine.close()
    return params, f"{label}, {torch.get_num_threads()} threads"


RUNNERS = {"fedforge": run_fedforge, "plain": run_plain}


# --- memory ---------------------------------------------------------------------------------


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory now (``VmRSS``) or its high-water mark (``VmHWM``),
    from ``/proc/self/status``; the peak from ``getrusage`` where that file is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_activation_bytes(work: LoraWork, precision: str, data: tuple) -> int:
    """Bytes autograd saves for one client's training step (its activations) on the first
    batch, measured as fedforge's engines measure them."""
    from fedforge.engine import classification_loss
    from fedforge.engine.activations import saved_activation_bytes

    x, y, idx, _ = data
    model = fedforge_model(work, precision)
    leaves = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    rows = idx[0, 0]
    return saved_activation_bytes(classification_loss(model, "fp32"), leaves, x[rows],
                                  y[rows], torch.ones(len(rows)))


def base_bytes(work: LoraWork) -> int:
    """The base model's weights as stored (its safetensors files)."""
    from fedforge.models.pretrained import resolve_source

    return sum(f.stat().st_size for f in resolve_source(work.path).weight_files)


def main(spec_path: str, out_path: str) -> None:
    """Run the spec's row and write its result (see the module docstring)."""
    pretrained_extra()  # imported before the start-up memory is read

    spec = json.loads(Path(spec_path).read_text())
    work = work_of(spec)
    data = make_batches(work, spec["cohort"])
    start_rss = rss_bytes()  # libraries imported, data built, no model yet
    clock = Clock(spec["launched"])
    leaves, label = RUNNERS[spec["framework"]](spec, work, data, clock)
    peak = rss_bytes("VmHWM")
    save_file({k: v.detach().float().contiguous() for k, v in leaves.items()},
              f"{out_path}.safetensors")
    Path(out_path).write_text(json.dumps({
        **clock.result(spec["warmup"]), "label": label, "start_rss": start_rss,
        "peak_rss": peak, "base_bytes": base_bytes(work),
        "adapter_bytes": sum(v.numel() * 4 for v in leaves.values()),
        "activation_bytes": step_activation_bytes(work, spec["precision"], data)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
