"""FedPTR (Chen et al. 2023): projected trajectory regularisation under extreme label skew."""

from __future__ import annotations

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, register

CLAIM = (
    "Under per-class Dirichlet α = 0.01 with 10 clients and full participation, FedPTR and "
    "FedPTR-S reach a higher final accuracy than FedAvg, FedProx, SCAFFOLD, FedDyn and FedDC, "
    "and the layer-adaptive λ beats a fixed λ. Chen, Cao, Wang, Hsieh & Chen, *Federated "
    "Learning with Projected Trajectory Regularization* (arXiv:2312.14380), Table 1 "
    "(CIFAR-10 and Fashion-MNIST rows, 100 % participation) and Table 4 (fixed vs adaptive λ)."
)

CONFIGS = {"c10": "examples/fedptr_cifar10_cpu.toml", "fm": "examples/fedptr_fmnist_cpu.toml"}
TITLES = {"c10": "CIFAR-10", "fm": "FMNIST"}
METHODS = (("fedavg", "FedAvg"), ("fedprox", "FedProx"), ("scaffold", "SCAFFOLD"),
           ("feddyn", "FedDyn"), ("feddc", "FedDC"), ("fedptr", "FedPTR"),
           ("fedptr_s", "FedPTR-S"))
BASELINES = ("fedavg", "fedprox", "scaffold", "feddyn", "feddc")

_T1 = {  # Table 1, 10 clients, 100 % participation, α = 0.01 (test accuracy %, width 128)
    "c10": ("55.43", "55.94", "56.58", "62.29", "52.55", "69.04", "68.16"),
    "fm": ("83.69", "83.75", "82.21", "84.36", "78.23", "85.11", "85.48"),
}
PAPER = {f"{p}_{a}": acc for p, row in _T1.items()
         for (a, _), acc in zip(METHODS, row, strict=True)}
PAPER["c10_fedptr_fixed"] = "62.10"  # Table 4

NOTES = """\
**Scale.** Kept from the paper: 10 clients, per-class Dirichlet α = 0.01 (`seed = 1`), every
client every round, one local epoch at batch 500, SGD lr 0.01 (momentum 0.5 for FedPTR as in
Sec. 5.1), λ = 0.05, K = 5 projection steps, the DD ConvNet of depth 3, 100 rounds. Scaled:
width 16 (paper 128); a fixed subset of 10 000 training images per dataset
(`data.options.max_train`, a seeded permutation independent of the run seed; the test sets
are whole), so a client holds about 1 000 images of one or two classes and takes about 2
local steps per round; trajectory matching with 1 image per class (|D̃| = 10, Table 3's
smallest set, 65.8 % vs 69.0 % on CIFAR-10), H = 3 outer and R = 3 student steps (paper 20,
10; D̃ and β are warm-started across rounds, so 100 rounds give 300 outer steps). Measured
wall time per 100-round FMNIST run on a quiet 2-core CPU, one thread per run: central
training ≈ 2.5 min, FedAvg-like methods ≈ 4 min (2.4 s per round, after the loop engine
stopped running each client for the longest client's schedule), FedPTR ≈ 5 min (of which
≈ 2 min trajectory matching and projection, `prep_s`; a test suite shared the machine):
≈ 2.2 h for the 30 FMNIST runs. The
stages run Fashion-MNIST's drift check (FedAvg against central training) first, then its
other six methods, then its ablations, then CIFAR-10 in the same order; every run resumes,
so the grid spans sessions. Accuracy every 10 rounds on the whole test set. FMNIST FedAvg
seed 0 and central training seeds 0 and 1 ran on the vmapped engine, every later run on the
loop (`auto`'s default for a conv net in a run too short to calibrate): the two agree to
float tolerance step by step (the engine parity tests), not bit for bit, so those pairs
carry a little extra noise.

**Mechanism.** Logged per layer (`fedptr_drift/<layer>` ‖x_i − x‖ as cohort means,
`fedptr_anchor_dist/<layer>` ‖x − w̃‖, `fedptr_prox/<layer>` the prox gradient's norm)
and the projected model's own test accuracy every 10 rounds
(`fedptr_projected_accuracy`). `fedptr_mtt_s` is the last round's MTT wall time beside
`wall_s` (MTT's work is charged to `sim_time_s`). The **drift check** trains the same model
centrally on the same 10 000 images (one client holding all of them, one epoch per round): the
gap between it and FedAvg is the room that drift leaves for any correction.

**Ablations.** Fixed λ (Table 4: `adaptive = false`, prox λ(w − w̃)) and trajectory
matching every 4 rounds instead of every round (Table 7). A control that is not in the
paper: FedPTR's clients use SGD with momentum 0.5 (Sec. 5.1) and the baselines plain SGD,
so FedAvg with the same momentum separates what the projection adds from what the momentum
does.
"""


def _dataset(p: str) -> tuple[Condition, ...]:
    cfg, title = CONFIGS[p], TITLES[p]
    conds = [Condition(f"{p}_{a}", a, label=f"{title}: {name}", config=cfg)
             for a, name in METHODS]
    conds += [
        Condition(f"{p}_fedptr_fixed", "fedptr", ("algorithm.adaptive=false",),
                  label=f"{title}: FedPTR, fixed λ", config=cfg),
        Condition(f"{p}_fedptr_mtt4", "fedptr", ("algorithm.mtt_every=4",),
                  label=f"{title}: FedPTR, MTT every 4 rounds", config=cfg),
        Condition(f"{p}_fedavg_m05", "fedavg",
                  ("algorithm.client_optimizer=momentum", "algorithm.local_momentum=0.5"),
                  label=f"{title}: FedAvg with FedPTR's local momentum 0.5", config=cfg),
        Condition(f"{p}_central", "fedavg",
                  ("data.num_clients=1", "server.clients_per_round=1",
                   "server.aggregation=uniform"),
                  label=f"{title}: drift check (1 client, all data)", config=cfg),
    ]
    return tuple(conds)


def _comparisons(p: str) -> tuple[Comparison, ...]:
    """Primary: FedPTR against each baseline and against FedAvg with FedPTR's own local
    momentum (the comparison that credits the projection, not the momentum, with a gain);
    FedPTR-S and the fixed λ are exploratory."""
    return (
        *(Comparison(f"{p}_fedptr", f"{p}_{b}", "final_acc", ">", primary=True)
          for b in BASELINES),
        Comparison(f"{p}_fedptr", f"{p}_fedavg_m05", "final_acc", ">", primary=True,
                   note="the paper credits the projection; this control holds the momentum"),
        *(Comparison(f"{p}_fedptr_s", f"{p}_{b}", "final_acc", ">") for b in BASELINES),
        Comparison(f"{p}_fedptr", f"{p}_fedptr_fixed", "final_acc", ">"),
    )


@register("fedptr")
def fedptr_spec() -> Reproduction:
    conditions = (*_dataset("c10"), *_dataset("fm"))
    core = lambda p: tuple(f"{p}_{a}" for a, _ in METHODS)  # noqa: E731
    extra = lambda p: (f"{p}_fedptr_fixed", f"{p}_fedptr_mtt4", f"{p}_fedavg_m05",  # noqa: E731
                       f"{p}_central")
    return Reproduction(
        name="fedptr",
        claim=CLAIM,
        config=CONFIGS["c10"],
        conditions=conditions,
        seeds=(0, 1, 2),
        target=None,
        comparisons=(*_comparisons("c10"), *_comparisons("fm")),
        diagnostics=("fedptr_drift/classifier", "fedptr_anchor_dist/classifier",
                     "fedptr_prox/classifier", "fedptr_projected_accuracy", "fedptr_mtt_s"),
        curves=(*core("c10"), "c10_central"),
        # the drift check first: FedAvg against central training on the same subset shows
        # whether drift leaves any room for a correction before the grid spends hours
        stages=(("fm_central", "fm_fedavg"), tuple(n for n in core("fm") if n != "fm_fedavg"),
                extra("fm")[:3], ("c10_central", "c10_fedavg"),
                tuple(n for n in core("c10") if n != "c10_fedavg"), extra("c10")[:3]),
        paper=PAPER,
        paper_title="paper: final test accuracy % (Tables 1, 4)",
        notes=NOTES,
        effects={"final_acc": (0.01, "one accuracy point; the paper's gains over the "
                               "baselines are 7–13 points")},
        families_note=("Primary: FedPTR against the five baselines and against FedAvg with "
                       "FedPTR's local momentum 0.5, on each dataset. FedPTR-S and the fixed "
                       "λ are exploratory. Declared after the runs had finished (issue 55)."),
        title="FedPTR",
        scale=(("clients", "10 (all every round)", "10 (all every round)"),
               ("rounds", "100", "100"),
               ("model parameters", "7.8 k (ConvNet depth 3, width 16)",
                "320 k (ConvNet depth 3, width 128)"),
               ("data", "10 000 training images per dataset", "the whole training sets")),
        caveats=(
            "FedPTR's clients use momentum 0.5 and the baselines plain SGD; the control with "
            "the same momentum is the comparison that isolates the projection.",
            "The final accuracy averages the last 5 evaluations (rounds 60–100), while some "
            "curves still rise.",
        ),
        ablations=tuple(
            (f"{TITLES[p]}: ablations and drift check",
             (f"{p}_fedptr", *extra(p), f"{p}_fedavg")) for p in ("c10", "fm")
        ) + ((f"{TITLES['fm']}: all methods", core("fm")),),
        paper_commands=(
            "fedforge compare examples/fedptr_cifar10.toml "
            "--algorithms fedavg,fedprox,scaffold,feddyn,feddc,fedptr,fedptr_s "
            "engine.device=cuda --seeds 0,1,2 --out runs/fedptr_c10_gpu",
            "fedforge compare examples/fedptr_fmnist.toml "
            "--algorithms fedavg,fedprox,scaffold,feddyn,feddc,fedptr,fedptr_s "
            "engine.device=cuda --seeds 0,1,2 --out runs/fedptr_fm_gpu",
        ),
        paper_compute=(
            "width-128 ConvNet on the full datasets, 100 rounds: training ≈ 50 k samples × "
            "≈ 0.2 GFLOP per round; per-client MTT (H 20, R 10, 100 images) adds ≈ 60 k "
            "unrolled sample-gradients per client per round, ≈ 10× the training."
        ),
    )
