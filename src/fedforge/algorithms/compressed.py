"""Communication-compressed algorithms built on the uplink codec hook.

* ``safl`` — SAFL (Chen, Li & Banerjee, "Sketched Adaptive Federated Deep Learning"),
  Alg. 1 + 2: K local SGD steps, uplink ``sk_t(x - x_i)`` with a fresh shared sketch per
  round, the server averages sketches, desketches once and applies AMSGrad (no bias
  correction; ``optimizer="adam"`` drops the max) with a cosine lr down to ``min_lr``.
* ``fetchsgd`` — count sketch with momentum and error accumulation in sketch space, top-k
  unsketch (Rothchild et al. 2020).
* ``topk_ef`` — top-k (or random-k / QSGD / sign) with client error feedback, server Adam.
* ``onebit_adam`` — 1-bit-Adam-style scaled-sign uplink with error feedback, server Adam.
* ``marina`` — compressed delta differences with occasional full synchronisation.

Uncompressed FedAdam is ``fedadam`` (or ``safl`` with ``sketch="identity"``). See docs/safl.md.
"""

from __future__ import annotations

from dataclasses import replace

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.uplink_diagnostics import UplinkDiagnostics
from fedforge.client.optimizers import local_optimizer
from fedforge.comm.codec import (
    Codec,
    CompressCodec,
    FetchSGDCodec,
    MarinaCodec,
    SketchCodec,
)
from fedforge.core.schedules import ScheduleLike
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.optimizers import ServerOptimizer, server_adam, server_sgd

SERVER_OPTS = ("amsgrad", "adam", "sgd")


def _server(name: str, lr: ScheduleLike, b1: float, b2: float, eps: float) -> ServerOptimizer:
    if name not in SERVER_OPTS:
        raise ValueError(f"algorithm.optimizer: expected one of {SERVER_OPTS}, got {name!r}")
    if name == "sgd":
        return server_sgd(lr)
    return server_adam(lr, b1, b2, eps, amsgrad=name == "amsgrad")


def _cosine(lr: ScheduleLike, rounds: int | None, min_lr: float) -> ScheduleLike:
    """A number plus a horizon -> the paper's cosine decay from ``lr`` to ``min_lr``."""
    if rounds is None or not isinstance(lr, (int, float)):
        return lr
    if int(rounds) < 1:
        raise ValueError(f"algorithm.rounds: expected an int >= 1, got {rounds!r}")
    return {"kind": "cosine", "init": float(lr), "rounds": int(rounds), "final": float(min_lr)}


def _algorithm(name: str, local_lr, client_optimizer, weight_decay, server, codec: Codec,
               description: str, diagnostics_window: int = 0) -> Algorithm:
    """``diagnostics_window`` > 0 adds :class:`UplinkDiagnostics` (decode error, top-k energy)."""
    parts = (UplinkDiagnostics(diagnostics_window),) if diagnostics_window else ()
    return Algorithm(name, local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay),
                     server, parts=parts, description=description, codec=codec)


@defaults_from("safl")
def safl(
    local_lr: ScheduleLike, server_lr: ScheduleLike, rounds: int | None, min_lr: float,
    b1: float, b2: float, eps: float, optimizer: str, sketch: str, sketch_size: int | None,
    compression: float | None, sketch_rows: int, sketch_seed: int, client_optimizer: str,
    weight_decay: ScheduleLike, diagnostics_window: int,
) -> Algorithm:
    """SAFL. ``sketch_size`` (b) overrides ``compression`` (d/b); ``rounds`` turns a numeric
    ``server_lr`` into cosine decay to ``min_lr`` over that many rounds."""
    codec = SketchCodec(sketch, sketch_size, None if sketch_size is not None else compression,
                        sketch_seed, sketch_rows)
    return _algorithm(
        "safl", local_lr, client_optimizer, weight_decay,
        _server(optimizer, _cosine(server_lr, rounds, min_lr), b1, b2, eps), codec,
        "SAFL (Chen et al.): sketched deltas, one desketch, server AMSGrad/Adam",
        diagnostics_window)


@defaults_from("fetchsgd")
def fetchsgd(
    local_lr: ScheduleLike, server_lr: ScheduleLike, momentum: float, sketch_size: int | None,
    compression: float | None, sketch_rows: int, k: int | None, topk_compression: float | None,
    sketch_seed: int, client_optimizer: str, weight_decay: ScheduleLike,
    diagnostics_window: int,
) -> Algorithm:
    """FetchSGD; top-k size ``k`` or ``d / topk_compression``; default ``cols // 10``
    (heavy hitters are recoverable only for k well below the sketch's column count)."""
    codec = FetchSGDCodec(sketch_size, None if sketch_size is not None else compression,
                          sketch_rows, k, topk_compression, momentum,
                          server_lr, sketch_seed)
    return _algorithm("fetchsgd", local_lr, client_optimizer, weight_decay, server_sgd(1.0),
                      codec, "FetchSGD (Rothchild et al. 2020): count sketch, sketched "
                      "momentum + error, top-k unsketch", diagnostics_window)


@defaults_from("topk_ef")
def topk_ef(
    local_lr: ScheduleLike, server_lr: ScheduleLike, b1: float, b2: float, eps: float,
    optimizer: str, method: str, k: int | None, compression: float | None, levels: int,
    error_feedback: bool, seed: int, client_optimizer: str, weight_decay: ScheduleLike,
    diagnostics_window: int,
) -> Algorithm:
    """Compressed uplink (``method``: topk | randk | qsgd | sign) + optional EF, server Adam."""
    codec = CompressCodec(method, k, None if k is not None else compression, levels,
                          error_feedback, seed)
    return _algorithm("topk_ef", local_lr, client_optimizer, weight_decay,
                      _server(optimizer, server_lr, b1, b2, eps), codec,
                      "top-k (or randk/qsgd/sign) uplink with error feedback, server Adam",
                      diagnostics_window)


@defaults_from("onebit_adam")
def onebit_adam(
    local_lr: ScheduleLike, server_lr: ScheduleLike, b1: float, b2: float, eps: float,
    error_feedback: bool, client_optimizer: str, weight_decay: ScheduleLike,
) -> Algorithm:
    """1-bit-Adam style: scaled-sign uplink with error feedback, server Adam (no warm-up
    phase or frozen variance; see docs/safl.md)."""
    codec = CompressCodec("sign", error_feedback=error_feedback)
    return _algorithm("onebit_adam", local_lr, client_optimizer, weight_decay,
                      _server("adam", server_lr, b1, b2, eps), codec,
                      "1-bit-Adam-style: scaled sign + EF uplink, server Adam")


@defaults_from("marina")
def marina(
    local_lr: ScheduleLike, server_lr: ScheduleLike, optimizer: str, b1: float, b2: float,
    eps: float, k: int | None, compression: float | None, sync_prob: float, seed: int,
    client_optimizer: str, weight_decay: ScheduleLike, diagnostics_window: int,
) -> Algorithm:
    """MARINA on deltas: unbiased random-k of delta differences, full sync w.p. ``sync_prob``.

    The server adds the mean compressed difference to the last mean delta it knows, which is
    the mean over every client only if every client sent one (Gorbunov et al. 2021, Alg. 1:
    all n workers each round); a sampled cohort biases it, so drivers refuse partial cohorts.
    """
    codec = MarinaCodec(k, None if k is not None else compression, sync_prob, seed)
    algorithm = _algorithm("marina", local_lr, client_optimizer, weight_decay,
                           _server(optimizer, server_lr, b1, b2, eps), codec,
                           "MARINA (Gorbunov et al. 2021): compressed differences, random "
                           "full sync", diagnostics_window)
    return replace(algorithm, requires=frozenset({"full_participation"}))
