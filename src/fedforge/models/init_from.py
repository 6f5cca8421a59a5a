"""``model.init_from``: start a run from saved weights (fine-tuning a pre-trained model).

Accepted sources, all read without unpickling (fedforge never calls ``torch.load``):

* a ``.safetensors`` file of the model's parameters (``fedforge pretrain`` writes
  ``model.safetensors``; so does :meth:`fedforge.experiment.runner.Experiment.save`); a
  ``torch.save``'d state dict converts with
  ``safetensors.torch.save_file(model.state_dict(), "model.safetensors")``;
* a fedforge run folder: the global parameters of its last complete checkpoint.

Every parameter of the model must be present with the same shape, the model's dtype and
finite values; extra keys (buffers, an optimizer's state) are refused too, so a wrong file
fails in one line naming it and the key.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.tree import Params


class InitFromError(ValueError):
    """A checkpoint that cannot initialise the model (one line: the file and the key)."""


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The flat parameter tensors saved at ``path`` -> (tensors, the file they came from)."""
    src = Path(path).expanduser()
    if src.is_dir():
        ckpt = src / "checkpoints"
        if not (ckpt / "latest.json").is_file():
            model = src / "model.safetensors"
            if model.is_file():
                return read_weights(model)
            raise InitFromError(f"model.init_from: {src} is a folder without "
                                "checkpoints/latest.json or model.safetensors")
        tensors, _ = load_checkpoint(ckpt, torch.device("cpu"))
        if "params" not in tensors:
            raise InitFromError(f"model.init_from: {ckpt}: the checkpoint has no 'params'")
        return _flat(tensors["params"]), ckpt
    if not src.is_file():
        raise InitFromError(f"model.init_from: {src}: no such file or folder")
    if src.suffix != ".safetensors":
        raise InitFromError(
            f"model.init_from: {src}: expected a .safetensors file or a run folder (convert a "
            f"state dict with safetensors.torch.save_file(state_dict, 'model.safetensors'))")
    from safetensors.torch import load_file  # noqa: PLC0415

    try:
        return load_file(str(src)), src
    except Exception as exc:  # noqa: BLE001 (corrupt or foreign file: one line)
        raise InitFromError(f"model.init_from: {src}: cannot read weights "
                            f"({type(exc).__name__}: {exc})") from None


def _flat(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_init(params: Params, path: str | Path) -> Params:
    """``params``' structure, dtype and device, with the values saved at ``path``."""
    loaded, src = read_weights(path)
    for key, value in params.items():
        if key not in loaded:
            raise InitFromError(f"model.init_from: {src}: missing key {key!r} "
                                f"(the model has {len(params)} tensors, the file {len(loaded)})")
        if tuple(loaded[key].shape) != tuple(value.shape):
            raise InitFromError(f"model.init_from: {src}: key {key!r} has shape "
                                f"{tuple(loaded[key].shape)}, the model expects "
                                f"{tuple(value.shape)}")
    extra = sorted(set(loaded) - set(params))
    if extra:
        raise InitFromError(f"model.init_from: {src}: unexpected key {extra[0]!r} "
                            f"(+{len(extra) - 1} more), not a parameter of this model")
    for key, value in params.items():
        check_values(src, key, loaded[key], value.dtype)
    return {k: loaded[k].to(v.device, v.dtype).clone() for k, v in params.items()}


def check_values(src: Path, key: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """The saved tensor must already have the run's dtype and finite values: a cast would
    silently turn a bool file into all-ones weights or round float64 ones, and a NaN start
    would be blamed on the clients (and rolled back to, again and again)."""
    if tensor.dtype != dtype:
        kind = "floating-point " if tensor.is_floating_point() else ""
        raise InitFromError(f"model.init_from: {src}: key {key!r} has {kind}dtype "
                            f"{tensor.dtype}, the model's parameters are {dtype}; save the "
                            f"weights as {dtype}")
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise InitFromError(f"model.init_from: {src}: key {key!r} holds {bad} NaN or Inf "
                            "values; initial weights must be finite")


def init_network(network: torch.nn.Module, path: str | Path) -> None:
    """Copy the weights saved at ``path`` into ``network``'s parameters, in place."""
    params = dict(network.named_parameters())
    values = load_init(params, path)
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(values[k])
