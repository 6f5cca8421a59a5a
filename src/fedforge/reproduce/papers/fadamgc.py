"""FAdamGC (Chen et al.): gradient correction before local Adam's moments, Table 2."""

from __future__ import annotations

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, register

CLAIM = (
    "FAdamGC reaches the target accuracy in fewer rounds than LocalAdam and FA-NT, and in "
    "fewer rounds than every momentum (SCAFFOLD-M, FedAvg-M) and server-adaptive (FedAMS, "
    "FedAdam) baseline; rounds to target order as FAdamGC < FA-NT < SCAFFOLD-M < LocalAdam "
    "< FedAvg-M < FedAMS < FedAdam. Chen, Wang, Zhang, Han, Liu & Brinton, *Gradient "
    "Correction in Federated Learning with Adaptive Optimization*, Table 2 (CIFAR-10, "
    "ResNet-18, n = 100, S = 10, S̃ = 5, Dir(0.1), K = 60, rounds to 75 %, 4 trials)."
)

PAPER_ROUNDS = {  # Table 2, CIFAR-10, rounds to 75 % (mean ± std of 4 trials)
    "fadamgc": "310.0 ± 16.8", "fa_nt": "394.8 ± 31.3", "scaffold_m": "544.3 ± 59.9",
    "localadam": "589.5 ± 74.0", "fedavg_m": "1014.5 ± 250.3", "fedams": "2388.8 ± 286.6",
    "fedadam": "2532.5 ± 343.3",
}

# Chosen from the pilot (FAdamGC, seed 0) before any other run finished; see NOTES.
TARGET = 0.83

NOTES = """\
**Scale.** Fashion-MNIST (60 k train / 10 k test) instead of CIFAR-10 and a 784-32-10 MLP
(25 k parameters) instead of ResNet-18, so that a round of 10 clients × 60 local steps takes
about 1 s on the two shared CPU cores (measured 0.25–3.5 s, depending on the other jobs'
load; 74 min of wall time for all 33 runs). Kept from the paper: n = 100 clients, S = 10 per
round, S̃ = 5 trackers, Dir(α = 0.1) label skew, K = 60 local steps (batch 32), β = (0.9,
0.99), ε = 1e-8, Table 4's CIFAR-10 learning rates (η_l / η_g: 1e-3 / 1 for the local-Adam
methods, 1e-2 / 1 for FedAvg-M and SCAFFOLD-M with β = 0.1, 3e-2 / 1e-3 for FedAdam and
FedAMS). 150 rounds, so each client tracks about 150 · 5 / 100 = 7.5 times and the
correction is live for most of the run (`tracking_tracked_share` in the diagnostic plot).
Accuracy: the global model on the full test set, every 2 rounds.

**Target 83 %, fixed before any comparison.** The first grid run, FAdamGC seed 0, served as
the pilot. Its curve rises fast to about 80 % by round 30 and then creeps up to about 84 %
by round 150. By round 75, the middle of the run, the best it had reached was 83.08 %
(round 70). Rounded down to half a point, that gives 83 %, which it first reached at round
50. No other run had finished when the target was set.

**Comparisons.** The primary family is Table 2's headline: FAdamGC needs fewer rounds to the
target than each of the six other methods (LocalAdam, FA-NT, SCAFFOLD-M, FedAvg-M, FedAMS,
FedAdam). The rest of Table 2's order, simulated time, final accuracy and the
initialisation row are exploratory. In the first version of this spec, the SCAFFOLD-M vs
LocalAdam row had the wrong sign (the paper has 544 < 590 rounds for SCAFFOLD-M); it was
corrected while the baseline seeds were still running. The paper makes no claim about the
initial tracking variables, so that row can differ from zero but never contradict it.
"""


EFFECTS = {
    "rounds": (15.0, "10 % of the 150-round budget; Table 2's smallest gap, FAdamGC − FA-NT, "
               "is 21 % of FA-NT's rounds"),
    "sim_time": (0.25, "about 10 % of a method's simulated time to the target here"),
    "final_acc": (0.01, "one accuracy point, the smallest gain the paper's tables discuss"),
}
FAMILIES = ("The families were declared after the 33 runs had finished (issue 55); the "
            "seeds the power rule asks for will test them as declared.")


def _conditions() -> tuple[Condition, ...]:
    """The seven methods of Table 2 with the paper's S̃ = 5, and the ablations of the
    tracking subset and of the initial tracking variables."""
    return (
        Condition("fadamgc", "fadamgc", label="FAdamGC (S̃ = 5)"),
        Condition("localadam", "localadam", label="LocalAdam"),
        Condition("fa_nt", "fa_nt", label="FA-NT (S̃ = 5)"),
        Condition("scaffold_m", "scaffold_m", label="SCAFFOLD-M"),
        Condition("fedavg_m", "fedavg_global_momentum", label="FedAvg-M"),
        Condition("fedams", "fedams", label="FedAMS"),
        Condition("fedadam", "fedadam", label="FedAdam"),
        Condition("fadamgc_fullgrad", "fadamgc", ("algorithm.tracking_init=full_gradient",),
                  label="FAdamGC, y_i = ∇f_i(x¹)"),
        Condition("fa_nt_fullgrad", "fa_nt", ("algorithm.tracking_init=full_gradient",),
                  label="FA-NT, y_i = ∇f_i(x¹)"),
        Condition("fadamgc_st0", "fadamgc", ("algorithm.tracking_fraction=0.0",),
                  label="FAdamGC, S̃ = 0"),
        Condition("fadamgc_st10", "fadamgc", ("algorithm.tracking_fraction=1.0",),
                  label="FAdamGC, S̃ = 10"),
    )


def _comparisons() -> tuple[Comparison, ...]:
    """Table 2's headline (the primary family: FAdamGC needs fewer rounds than each other
    method), then what is exploratory: simulated time, final accuracy, the rest of the
    order and the initialisation."""
    return (
        *(Comparison("fadamgc", b, "rounds", "<", primary=True)
          for b in ("localadam", "fa_nt", "scaffold_m", "fedavg_m", "fedams", "fedadam")),
        Comparison("fadamgc", "localadam", "sim_time", "<"),
        Comparison("fadamgc", "fa_nt", "sim_time", "<"),
        Comparison("fadamgc", "localadam", "final_acc", ">"),
        Comparison("fadamgc", "fa_nt", "final_acc", ">"),
        # the rest of Table 2's order (paper rounds in the spec's `paper` column)
        Comparison("fa_nt", "scaffold_m", "rounds", "<"),
        Comparison("scaffold_m", "localadam", "rounds", "<"),
        Comparison("localadam", "fedavg_m", "rounds", "<"),
        Comparison("localadam", "fedams", "rounds", "<"),
        Comparison("localadam", "fedadam", "rounds", "<"),
        Comparison("fadamgc_fullgrad", "fadamgc", "rounds", "<", kind="none",
                   note="the paper does not compare initialisations"),
    )


@register("fadamgc")
def fadamgc_spec() -> Reproduction:
    adam = ("fadamgc", "localadam", "fa_nt")
    return Reproduction(
        name="fadamgc",
        claim=CLAIM,
        config="examples/fadamgc_fmnist_k60.toml",
        conditions=_conditions(),
        seeds=(0, 1, 2),
        target=TARGET,
        stages=(adam, ("scaffold_m", "fedavg_m", "fedams", "fedadam"),
                ("fadamgc_fullgrad", "fa_nt_fullgrad"), ("fadamgc_st10", "fadamgc_st0")),
        comparisons=_comparisons(),
        effects=EFFECTS,
        families_note=FAMILIES,
        title="FAdamGC",
        scale=(("clients (per round)", "100 (10)", "100 (10)"),
               ("rounds", "150", "up to 3000 (310–2533 to the target)"),
               ("model parameters", "25.4 k (784-32-10 MLP, Fashion-MNIST)",
                "11.2 M (ResNet-18, CIFAR-10)"),
               ("target", "83 %", "75 %")),
        caveats=(
            "FedAvg-M and FedAdam never reach the target in 150 rounds, so their comparisons "
            "rest on an exact sign test, which cannot go below p = 0.25 with 3 seeds.",
            "The curves flatten at 82–84 %, so rounds to target measure a plateau crossing: "
            "the FA-NT gap is about 0 at the 80 % and 82 % targets (sensitivity table).",
            "The primary family was declared after the runs; the seeds the power rule asks "
            "for are still to be run.",
        ),
        diagnostics=("tracking_corr_norm", "tracking_dev_all", "tracking_tracked_share",
                     "tracking_corr_rel"),
        curves=("fadamgc", "localadam", "fa_nt", "scaffold_m", "fedavg_m", "fedams", "fedadam"),
        paper=PAPER_ROUNDS,
        paper_title="paper: rounds to 75 % (CIFAR-10)",
        sensitivity=(0.80, 0.82, 0.835),
        notes=NOTES,
        ablations=(
            ("Tracking subset S̃ (FAdamGC; S̃ = 0 is LocalAdam)",
             ("fadamgc_st0", "fadamgc", "fadamgc_st10")),
            ("Initial tracking variables",
             ("fadamgc", "fadamgc_fullgrad", "fa_nt", "fa_nt_fullgrad")),
        ),
        paper_commands=(
            "fedforge compare examples/fadamgc_cifar10.toml "
            "-a fadamgc,fa_nt,localadam,scaffold_m,fedavg_global_momentum,fedams,fedadam "
            "model.name=resnet18_gn 'model.options={}' client.local_steps=60 rounds=3000 "
            "engine.device=cuda --target 0.75 --seeds 0,1,2,3 --out runs/fadamgc_c10_gpu",
        ),
        paper_compute=(
            "one run = 10 clients × 60 steps × 32 samples × ≈ 3.3 GFLOP (ResNet-18 training, "
            "per sample) ≈ 63 PFLOP per 1000 rounds: about 1 A100-hour at fp32 peak, 2–3 at "
            "realistic utilisation. 7 methods × 4 seeds stopped at the paper's rounds to "
            "target (310–2533) ≈ 31 k rounds ≈ 80 A100-hours; all to 3000 rounds ≈ 210."
        ),
    )
