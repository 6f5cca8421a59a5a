"""FedNAR (Li et al., NeurIPS 2023): weight decay co-clipped with the gradient, any backbone."""

from __future__ import annotations

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, Sweep, register

CLAIM = (
    "Adding NAR (weight decay inside the clip, annealed) to each of six backbones — FedAvg, "
    "FedProx, SCAFFOLD, FedExP, FedAdam, FedAvgM — gives final test accuracy at least as "
    "high as the same backbone with clipped SGD and the decay added after the clip, on "
    "CIFAR-10 (Dir(0.3), ResNet-18) and on Shakespeare. Li, Chen, Liu, Wang & Xing, *FedNAR: "
    "Federated Optimization with Normalized Annealing Regularization*, NeurIPS 2023 (main "
    "figures; release scripts of ljb121002/fednar for every setting)."
)

BACKBONES = (  # (condition prefix, algorithm, label)
    ("fedavg", "fedavg", "FedAvg"),
    ("fedprox", "fedprox", "FedProx"),
    ("scaffold", "scaffold", "SCAFFOLD"),
    ("fedexp", "fedexp", "FedExP"),
    ("fedadam", "fedadam", "FedAdam"),
    ("fedavgm", "fedavg_server_momentum", "FedAvgM"),
)

# The authors' dev logs (first commit of ljb121002/fednar, 2000-round runs of the release
# settings, Dir(0.3)): test accuracy at round 1000, baseline -> NAR. Not the paper's tables,
# which we could not find; FedAdam's logs collapse after ~700 rounds.
PAPER = {
    "fedavg_vanilla": "85.83", "fedavg_nar": "87.97",
    "fedprox_vanilla": "86.00", "fedprox_nar": "87.87",
    "scaffold_vanilla": "86.89", "scaffold_nar": "89.17",
    "fedexp_vanilla": "86.46", "fedexp_nar": "88.55",
    "fedavgm_vanilla": "90.74", "fedavgm_nar": "90.43",
}

CIFAR = "examples/fednar_cifar10.toml"
SHAKESPEARE = "examples/fednar_shakespeare.toml"

# The CPU scale, fixed from the regime pilot before the grid (see NOTES).
CIFAR_SCALE = (
    "rounds=100", "eval.every=5", "server.clients_per_round=10", "checkpoint.every=10",
    "engine.name=procs", "client.max_grad_norm=5.0",
)
SHAKESPEARE_SCALE = ("rounds=50", "eval.every=5", "checkpoint.every=10", "engine.name=procs",
                     "client.max_grad_norm=3.0")
LAMBDAS = ("0.01", "0.1", "0.3")

NOTES = """\
**Scale.** CIFAR-10 keeps the release scripts' partition (100 equal clients of 500 images,
per-client Dir(0.3) label priors), K = 20 local steps of batch 50, η_l = 0.01 annealed by
γ = 0.998 per round, the per-backbone λ (0.05 for FedAvg/FedProx/SCAFFOLD, 0.01 for
FedExP/FedAdam/FedAvgM), FedProx μ = 0.001, FedExP ε = 0, FedAdam with the code's rule
(η = 0.1, τ_t = 0.01·γ^{2t}) and FedAvgM β = 0.9. Scaled: 10 clients per round (the scripts
sample 20), 100 rounds (1000), and a 2-conv CNN instead of ResNet-18-GN.

**Engine.** The CIFAR-10 runs split each cohort over single-threaded worker processes
(`engine.name = "procs"`, one per CPU, each running the loop); its results equal the loop's
to float tolerance. Seed 0 of `fedavg_vanilla`, `fedavg_nar` and `fedavg_a10_vanilla` ran
earlier with the loop in one process.

**The regime.** Co-clipping can only matter when the clip fires. With the code's A = 10
(tuned for ResNet-18's gradient norms), vanilla FedAvg on this CNN (seed 0, 100 rounds; the
`fedavg_a10_*` conditions) had a mean pre-clip norm of 4.8 over rounds 51–100 and clipped
only 4.3 % of its local steps there, below the 10 % a test of the mechanism needs. The grid
therefore uses A = 5, the measured norm scale rounded to a whole number, fixed from that one
run before any NAR run; A = 10 stays as an ablation for FedAvg. The diagnostic figure shows
the fraction of clipped local steps per round (`clip_fraction`) and the mean pre-clip norm
(`clip_norm`) for every condition.

**Shakespeare.** The config's transformer (d = 64, 2 layers), 100 speaking roles of at most
200 windows, 10 per round, K = 10 steps of batch 20, λ = 10⁻⁴, 50 rounds. The same rule set
its threshold: vanilla FedAvg at the code's A = 10 (seed 0, 50 rounds, raw metrics in
`pilot/shk_fedavg_vanilla_A10.jsonl`) clipped none of its local steps, with a mean
pre-clip norm of 2.77 over rounds 26–50, so at A = 10 NAR and vanilla take the same steps.
The Shakespeare conditions clip at A = 3, fixed from that run before any NAR run; FedAvg at
A = 10 stays as an ablation. They also run in worker processes (`engine.name = "procs"`).
"""


def _with_and_without(name: str, algorithm: str, label: str, overrides: tuple[str, ...],
                      suffix: str = "", config: str | None = None
                      ) -> tuple[Condition, Condition]:
    """``<name>_vanilla`` and ``<name>_nar``: the same run with the decay added after the clip
    or inside it; labels ``<label><suffix>`` and ``<label> + NAR<suffix>``."""
    return (
        Condition(f"{name}_vanilla", algorithm, (*overrides, "client.nar=false"),
                  label=f"{label}{suffix}", config=config),
        Condition(f"{name}_nar", algorithm, (*overrides, "client.nar=true"),
                  label=f"{label} + NAR{suffix}", config=config),
    )


def _cifar(prefix: str, algorithm: str, label: str) -> tuple[Condition, Condition]:
    return _with_and_without(prefix, algorithm, label, CIFAR_SCALE)


def _shakespeare(prefix: str, algorithm: str, label: str, extra: tuple[str, ...] = (),
                 suffix: str = "") -> tuple[Condition, Condition]:
    return _with_and_without(f"shk_{prefix}", algorithm, f"Shakespeare {label}",
                             (*SHAKESPEARE_SCALE, *extra), suffix, SHAKESPEARE)


def _paper_threshold() -> tuple[Condition, Condition]:
    return _with_and_without("fedavg_a10", "fedavg", "FedAvg",
                             (*CIFAR_SCALE, "client.max_grad_norm=10.0"), ", A = 10")


def _shakespeare_paper_threshold() -> tuple[Condition, Condition]:
    return _shakespeare("fedavg_a10", "fedavg", "FedAvg", ("client.max_grad_norm=10.0",),
                        ", A = 10")


def _lambda(value: str) -> tuple[Condition, Condition]:
    return _with_and_without(f"fedavg_wd{value}", "fedavg", "FedAvg",
                             (*CIFAR_SCALE, f"client.weight_decay={value}"), f", λ = {value}")


@register("fednar")
def fednar_spec() -> Reproduction:
    cifar = [c for b in BACKBONES for c in _cifar(*b)]
    shakespeare = [
        *_shakespeare("fedavg", "fedavg", "FedAvg"),
        *_shakespeare("fedadam", "fedadam", "FedAdam", (
            "client.lr.init=0.01", "algorithm.server_lr=0.1", "algorithm.adam_rule=fednar_code",
            'algorithm.tau={"schedule":"exponential","init":0.01,"gamma":0.996004}')),
    ]
    sweep = [c for v in LAMBDAS for c in _lambda(v)]
    paper_a = list(_paper_threshold())
    shk_a = list(_shakespeare_paper_threshold())
    conditions = (*cifar, *shakespeare, *sweep, *paper_a, *shk_a)
    # FedProx runs almost the same steps as FedAvg here: a duplicate, so exploratory
    comparisons = tuple(
        Comparison(f"{p}_nar", f"{p}_vanilla", "final_acc", ">", primary=p != "fedprox")
        for p, _, _ in BACKBONES
    ) + (
        Comparison("shk_fedavg_nar", "shk_fedavg_vanilla", "final_acc", ">", primary=True),
        Comparison("shk_fedadam_nar", "shk_fedadam_vanilla", "final_acc", ">", primary=True),
    )
    return Reproduction(
        name="fednar",
        claim=CLAIM,
        config=CIFAR,
        conditions=conditions,
        seeds=(0, 1, 2),
        target=None,
        comparisons=comparisons,
        stages=(
            tuple(c.name for c in cifar[:2]),  # FedAvg first: the regime check
            tuple(c.name for c in cifar[2:]),
            tuple(c.name for c in shakespeare),
            tuple(c.name for c in sweep),
            tuple(c.name for c in paper_a),
            tuple(c.name for c in shk_a),
        ),
        diagnostics=("clip_fraction", "clip_norm"),
        curves=tuple(c.name for c in (*cifar, *paper_a)),
        paper=PAPER,
        paper_title="authors' logs: acc. % at round 1000 (CIFAR-10, ResNet-18)",
        notes=NOTES,
        effects={"final_acc": (0.01, "one accuracy point, the smallest gain the paper's "
                               "figures show for NAR over a backbone")},
        families_note=("Primary: NAR against each backbone, CIFAR-10 and Shakespeare; "
                       "FedProx's runs nearly duplicate FedAvg's, so its row is exploratory. "
                       "Declared after the runs had finished (issue 55)."),
        title="FedNAR",
        scale=(("clients (per round)", "100 (10)", "100 (20)"),
               ("rounds", "100 (CIFAR-10), 50 (Shakespeare)", "1000"),
               ("model parameters", "17.9 k (2-conv CNN, channels 4/8, fc 32)",
                "11.2 M (ResNet-18-GN): 626 times ours")),
        caveats=(
            "At 17.9 k parameters, 1/626 of ResNet-18, any reduction of weight decay may "
            "help; a gain here does not show that the paper's mechanism acts.",
            "FedAvg and FedProx take nearly the same steps, so they count as one result.",
        ),
        ablations=(
            ("Clip threshold (FedAvg, CIFAR-10): the code's A = 10 against the grid's A = 5",
             tuple(c.name for c in (*paper_a, *cifar[:2]))),
            ("Shakespeare (A = 3; FedAvg also at the code's A = 10)",
             tuple(c.name for c in (*shakespeare, *shk_a))),
        ),
        sweeps=(Sweep(
            "λ sweep (FedAvg, CIFAR-10, A = 5)", "λ (initial weight decay)",
            tuple(sorted([(0.05, "fedavg_nar", "fedavg_vanilla"),
                          *[(float(v), f"fedavg_wd{v}_nar", f"fedavg_wd{v}_vanilla")
                            for v in LAMBDAS]])),
            a_label="FedAvg + NAR", b_label="FedAvg"),),
        paper_commands=tuple(
            f"fedforge compare {CIFAR} -a {alg} model.name=resnet18_gn 'model.options={{}}' "
            f"rounds=1000 server.clients_per_round=20 engine.device=cuda "
            f"client.nar={nar} --seeds 0,1,2 --out runs/fednar_gpu_{p}_{'nar' if nar else 'wd'}"
            for p, alg, _ in BACKBONES for nar in ("true", "false")
        ),
        paper_compute=(
            "one run = 20 clients × 20 steps × 50 samples × ≈ 1.7 GFLOP (ResNet-18 training, "
            "per 32×32 sample) ≈ 34 TFLOP per round, 34 PFLOP per 1000 rounds: ≈ 0.5 A100-hour "
            "at realistic utilisation. 12 conditions × 3 seeds ≈ 20 A100-hours."
        ),
    )
