"""FedGen (Zhu, Hong & Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021; official code zhuangdizhu/FedGen, ``serverpFedGen.py``,
``userpFedGen.py``), as its code runs it.

FedAvg whose clients are regularised by a conditional generator G(z | y) the server learns
from the clients' heads. The generator (:mod:`.generator`) maps noise and a one-hot label to
a latent ``z`` at the input of the model's head h (its last linear layer, or ``[model]
head``). In round t (1-based) a client's local step descends

    CE(h(f(x)), y) + [t > 1] (B_g / B · α_t · mean_j CE(h(z_j), ŷ_j)
                              + β_t · KL(softmax(h(z(y))) ‖ softmax(h(f(x)))))

with ``ŷ`` B_g labels drawn uniformly, ``z_j ~ G(· | ŷ_j)``, ``z(y) ~ G(· | y)`` for the
batch's own labels (its softmax a fixed target), and ``α_t = max(1e-4, α · decay^(t−1))``,
β_t likewise. Every client uploads its head and its label counts of the round (1 + the
labels of the batches it trained on). The server averages the models (n_i / n) and takes
``steps`` Adam steps on the generator's loss

    teacher + η · diversity,  teacher = Σ_k CE(h_k(G(ε, y)), y) weighted by w_{y,k}
                                     = c_k(y) / Σ_k' c_k'(y),

for labels y drawn uniformly from those some client saw, with the code's diversity loss. The
code multiplies the batch means of each client's cross-entropy and of its weights
(``label_weighting = "batch"``, a broadcast of ``[B]`` by ``[B, 1]``); ``"sample"`` weights
each sample's cross-entropy by its own label's weight. The generator's learning rate decays
by ``generator_lr_decay`` per round. The generator, its batch statistics and its Adam state
are server state; clients keep nothing between rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.generator import (
    adam_init,
    adam_step,
    diversity_loss,
    generate,
    init_generator,
)
from fedforge.algorithms.personal.representation import head_weight
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext
from fedforge.comm.rng import randint, stream_key, uniform
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import LOCAL_STEP, Algorithm, FinalizeInputs, Part, PrepareInputs
from fedforge.server.optimizers import server_sgd

NAME = "fedgen"
KEY, SLOT, COUNTS = "fedgen_key", "fedgen_slot", "fedgen_counts"
WEIGHTINGS = ("batch", "sample")
FLOOR = 1e-4  # the code's exp_lr_scheduler: max(1e-4, init · decay^t)


def label_weights(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w [K, S], qualified labels)`` from the cohort's label counts ``[S, K]`` (0 for a
    slot no client filled): ``w_{y,k} = c_k(y) / Σ_k' c_k'(y)``; a label qualifies when some
    client counted it more than once, i.e. saw it (the code's MIN_SAMPLES_PER_LABEL = 1)."""
    w = counts / counts.sum(0).clamp_min(torch.finfo(counts.dtype).tiny)
    return w.T, torch.nonzero(counts.max(0).values > 1).flatten()


def teacher_loss(z: torch.Tensor, y: torch.Tensor, heads_w: torch.Tensor,
                 heads_b: torch.Tensor | None, w: torch.Tensor, weighting: str) -> torch.Tensor:
    """The clients' heads ``[S, K, d]`` on the latents ``z [B, d]``: each one's cross-entropy
    on ``y``, weighted by ``w [K, S]`` at each sample's label and summed over the clients."""
    logits = torch.einsum("bd,skd->sbk", z, heads_w)
    if heads_b is not None:
        logits = logits + heads_b.unsqueeze(1)
    ce = F.cross_entropy(logits.transpose(1, 2), y.expand(logits.shape[0], -1),
                         reduction="none")  # [S, B]
    weights = w[y].T  # [S, B]
    if weighting == "batch":
        return (ce.mean(1) * weights.mean(1)).sum()
    return (ce * weights).mean(1).sum()


class Generator(Part):
    """The server's generator (trained on the cohort's heads and label counts each round,
    broadcast with its running statistics) and FedGen's local objective."""

    name = NAME
    prepares = True  # the label counts of each client's round, from its batch schedule

    def __init__(self, hp: dict, patterns: tuple[str, ...] | None) -> None:
        self.hp, self.patterns = hp, patterns
        self.model: nn.Module | None = None

    def bind_model(self, model: nn.Module) -> None:
        """Refuses a model whose head is not one ``nn.Linear`` (the latents are its input)."""
        head = head_weight(dict(model.named_parameters()), self.patterns, NAME)
        module = model.get_submodule(head.rpartition(".")[0])
        if type(module) is not nn.Linear:
            raise ValueError(f"{NAME}: the model's head {head.rpartition('.')[0]!r} must be "
                             f"one nn.Linear layer whose input the generator's latents "
                             f"replace (a body/head split), got {type(module).__name__}")
        self.model = model

    def _head(self, params: Params) -> tuple[torch.Tensor, torch.Tensor | None]:
        name = head_weight(params, self.patterns, NAME)
        return params[name], params.get(name.rpartition(".")[0] + ".bias")

    def server_init(self, params: Params) -> dict:
        w = self._head(params)[0]  # [K, d]
        gen = init_generator(self.hp["noise_dim"], w.shape[0], self.hp["hidden_dim"],
                             w.shape[1], self.hp["seed"], w)
        return {"generator": gen["params"], "stats": gen["stats"],
                "adam": adam_init(gen["params"])}

    def broadcast(self, server_state: dict) -> dict:
        return {"generator": server_state["generator"], "stats": server_state["stats"]}

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {KEY: torch.randint(0, 2**32, (num_sampled,), generator=generator)}

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        """Each client's label counts of the round ``[C, K]`` (the labels of its batches) and
        its slot in the cohort (a one-hot row ``[C]``) for the uploads."""
        classes = self._head(prep.global_params)[0].shape[0]
        labels = F.one_hot(prep.y_all[prep.sample_idx], classes)  # int64 x weights: their dtype
        counts = (labels * prep.weights.unsqueeze(-1)).sum((1, 2))
        slots = torch.eye(counts.shape[0], dtype=counts.dtype, device=counts.device)
        return {}, {COUNTS: counts, SLOT: slots}, {}  # clients keep nothing

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        """The trained head and ``1 +`` the label counts, in this client's slot of ``[C, ...]``
        (the server reads each client's row back from the cohort's mean)."""
        slot = fin.ctx.info[SLOT]
        w, b = self._head(fin.params)
        up = {"heads_w": slot[:, None, None] * w, "counts": slot[:, None] * (
            fin.ctx.info[COUNTS] + 1).to(w.dtype)}
        if b is not None:
            up["heads_b"] = slot[:, None] * b
        return {}, up

    def upload_nbytes(self, params: Params, server_state: dict) -> int:
        w = self._head(params)[0]
        return w.shape[0] * w.element_size()  # the label counts; the head is in the model

    def server_update(self, server_state: dict, mean_uploads: dict, agg) -> dict:
        """``steps`` Adam steps of the generator on the cohort's heads (mean × S: each row is
        one client's), at learning rate ``lr · decay^(t−1)``."""
        if not mean_uploads:
            return server_state
        s = agg.num_sampled
        counts = mean_uploads["counts"] * s
        heads_b = mean_uploads["heads_b"] * s if "heads_b" in mean_uploads else None
        w, qualified = label_weights(counts)
        if qualified.numel() == 0:
            return server_state
        return train_generator(server_state, mean_uploads["heads_w"] * s, heads_b, w,
                               qualified, agg.round, self.hp)

    def loss(self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             ctx: RoundContext) -> torch.Tensor:
        """The client's masked mean cross-entropy plus, after round 1, the generator's terms."""
        if self.model is None:
            raise ValueError(f"{NAME}: call algorithm.bind_model(model) first (the runner does)")
        if LOCAL_STEP not in ctx.info:
            raise ValueError(f"{NAME}: its local loss draws fresh latents at every step and "
                             "needs the step's index (the objective stage's gradient)")
        logits = torch.func.functional_call(self.model, params, (x,))
        logq = F.log_softmax(logits, dim=-1)
        n = w.sum().clamp_min(1.0)
        ce = -(logq.gather(1, y.unsqueeze(1)).squeeze(1) * w).sum() / n
        teacher, latent = self._regulariser(params, y, logq, ctx)
        t = ctx.round.to(logq.dtype)
        decay = self.hp["decay"] ** (t - 1)
        alpha = torch.clamp_min(self.hp["alpha"] * decay, FLOOR)
        beta = torch.clamp_min(self.hp["beta"] * decay, FLOOR)
        ratio = self.hp["gen_batch_size"] / x.shape[0]
        on = (t > 1).to(logq.dtype)
        return ce + on * (ratio * alpha * teacher + beta * (latent * w).sum() / n)

    def _regulariser(self, params, y, logq, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean CE of the head on latents of uniformly drawn labels, per-sample KL of the
        head on latents of the batch's labels to the model on the batch [B])``."""
        server = ctx.broadcast[NAME]
        gen, stats = server["generator"], server["stats"]
        noise, k = self.hp["noise_dim"], ctx.info[LOCAL_STEP]
        head_w, head_b = self._head(params)
        key = ctx.info[KEY]
        eps = uniform(stream_key(key, k, 0), torch.arange(y.shape[0] * noise, device=y.device),
                      logq.dtype).view(-1, noise)
        target = F.softmax(F.linear(generate(gen, stats, y, eps, False)[0], head_w, head_b),
                           dim=-1).detach()
        latent = (torch.special.xlogy(target, target) - target * logq).sum(-1)
        bg = self.hp["gen_batch_size"]
        drawn = randint(stream_key(key, k, 1), torch.arange(bg, device=y.device),
                        head_w.shape[0])
        eps = uniform(stream_key(key, k, 2), torch.arange(bg * noise, device=y.device),
                      logq.dtype).view(bg, noise)
        z = generate(gen, stats, drawn, eps, False)[0]
        teacher = F.cross_entropy(F.linear(z, head_w, head_b), drawn)
        return teacher, latent


def train_generator(state: dict, heads_w: torch.Tensor, heads_b: torch.Tensor | None,
                    w: torch.Tensor, qualified: torch.Tensor, round_: int, hp: dict) -> dict:
    """The code's ``train_generator``: ``steps`` Adam steps on ``teacher + η · diversity``,
    each on ``batch_size`` labels drawn uniformly from ``qualified`` and fresh U(0, 1)
    noise, from a generator seeded by ``(seed, round)``."""
    g = torch.Generator().manual_seed(int(stream_key(hp["seed"], round_)))
    params, stats, opt = state["generator"], state["stats"], state["adam"]
    lr = hp["generator_lr"] * hp["generator_lr_decay"] ** (round_ - 1)
    for _ in range(hp["generator_steps"]):
        pick = torch.randint(0, qualified.numel(), (hp["generator_batch_size"],), generator=g)
        y = qualified[pick.to(qualified.device)]
        eps = torch.rand(y.shape[0], hp["noise_dim"], generator=g,
                         dtype=torch.float64).to(heads_w)
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        with torch.enable_grad():
            z, stats = generate(leaves, stats, y, eps, True)
            loss = (teacher_loss(z, y, heads_w, heads_b, w, hp["label_weighting"])
                    + hp["eta"] * diversity_loss(eps, z))
            grads = torch.autograd.grad(loss, list(leaves.values()))
        params, opt = adam_step(params, dict(zip(leaves, grads, strict=True)), opt, lr,
                                hp["generator_weight_decay"])
    return {"generator": params, "stats": stats, "adam": opt}


@defaults_from("fedgen")
def fedgen(local_lr: ScheduleLike, alpha: float, beta: float, decay: float,
           gen_batch_size: int, generator_lr: float, generator_lr_decay: float,
           generator_weight_decay: float, generator_steps: int, generator_batch_size: int,
           eta: float, noise_dim: int, hidden_dim: int, label_weighting: str, seed: int,
           head: Sequence[str] | None) -> Algorithm:
    """FedGen: FedAvg with a server-trained generator of head-input latents regularising
    every client's head."""
    for field, value in (("alpha", alpha), ("beta", beta), ("eta", eta),
                         ("generator_weight_decay", generator_weight_decay)):
        if value < 0:
            raise ValueError(f"algorithm.{field}: expected >= 0, got {value}")
    for field, value in (("decay", decay), ("generator_lr_decay", generator_lr_decay)):
        if not 0 < value <= 1:
            raise ValueError(f"algorithm.{field}: expected 0 < decay <= 1, got {value}")
    for field, value in (("gen_batch_size", gen_batch_size), ("generator_steps", generator_steps),
                         ("generator_batch_size", generator_batch_size),
                         ("noise_dim", noise_dim), ("hidden_dim", hidden_dim)):
        if int(value) != value or value < 1:
            raise ValueError(f"algorithm.{field}: expected an integer >= 1, got {value}")
    if generator_lr <= 0:
        raise ValueError(f"algorithm.generator_lr: expected > 0, got {generator_lr}")
    if label_weighting not in WEIGHTINGS:
        raise ValueError(f"algorithm.label_weighting: expected one of {WEIGHTINGS}, got "
                         f"{label_weighting!r}")
    hp = {"alpha": float(alpha), "beta": float(beta), "decay": float(decay),
          "gen_batch_size": int(gen_batch_size), "generator_lr": float(generator_lr),
          "generator_lr_decay": float(generator_lr_decay),
          "generator_weight_decay": float(generator_weight_decay),
          "generator_steps": int(generator_steps),
          "generator_batch_size": int(generator_batch_size), "eta": float(eta),
          "noise_dim": int(noise_dim), "hidden_dim": int(hidden_dim),
          "label_weighting": label_weighting, "seed": int(seed)}
    part = Generator(hp, None if head is None else tuple(head))
    return Algorithm(NAME, local_optimizer("sgd", local_lr), server_sgd(1.0), parts=(part,),
                     objective=part, aggregation="num_samples",
                     description="FedGen (Zhu et al. 2021): local CE + α_t·CE(h(G(ŷ)), ŷ) + "
                                 "β_t·KL(h(G(y)) ‖ model(x)) from round 2; the server trains "
                                 "G on the cohort's heads weighted by label counts, plus a "
                                 "diversity loss; FedAvg server")
