"""Shape helpers shared by the model zoo.

Flatten sizes are computed arithmetically from ``input_shape`` (instead of a dummy forward)
so that construction is cheap, deterministic and never touches the RNG.
"""

from __future__ import annotations

from collections.abc import Sequence


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial output size of a conv/pool layer (PyTorch floor convention)."""
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"input spatial size {size} too small for kernel {kernel}")
    return out


def image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    """Validate and unpack a ``(C, H, W)`` input shape (a bare ``(H, W)`` means C=1)."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3:
        raise ValueError(f"{model} expects input_shape (C, H, W) or (H, W), got {input_shape}")
    c, h, w = shape
    return c, h, w


def seq_len(input_shape: Sequence[int], model: str) -> int:
    """Sequence length from a token input shape ``(T,)``."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 1:
        raise ValueError(f"{model} expects input_shape (T,) for token inputs, got {input_shape}")
    return shape[0]
