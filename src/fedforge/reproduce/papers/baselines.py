"""The baselines non-IID papers compare against: three headline claims, checked with a verdict.

MOON against FedAvg and FedProx (CIFAR-10 Dir(0.5)), q-FFL's fairness against its q = 0 case
(Synthetic(1, 1)) and Oort's time to accuracy against uniform sampling (Synthetic(1, 1) on a
clock of heterogeneous device speeds), each at CPU scale.
"""

from __future__ import annotations

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, register

CLAIM = (
    "Three claims from the papers the baselines come from. (1) MOON reaches a higher test "
    "accuracy than FedAvg and FedProx on CIFAR-10 split Dir(0.5) over 10 parties: Li, He & "
    "Song, *Model-Contrastive Federated Learning*, CVPR 2021, Table 1 (69.1 % against 66.3 % "
    "and 66.9 %). (2) q-FFL makes the accuracy more uniform across devices, a lower variance "
    "of the devices' accuracies, at a small cost in mean accuracy: Li, Sanjabi, Beirami & "
    "Smith, *Fair Resource Allocation in Federated Learning*, ICLR 2020, Table 2 (Synthetic: "
    "q = 1 against q = 0). (3) Oort's participant selection reaches a target accuracy in less "
    "wall-clock time than random selection on devices of heterogeneous speed: Lai, Zhu, "
    "Madhyastha & Chowdhury, *Oort: Efficient Federated Learning via Guided Participant "
    "Selection*, OSDI 2021 (time to accuracy 1.2x to 14.1x better than existing selection)."
)

MOON = "examples/moon_cifar10.toml"
QFFL = "examples/qffl_synthetic.toml"
OORT = "examples/oort_time_to_accuracy.toml"

# MOON's CPU scale, fixed from one timed round of the example before any run (see NOTES)
MOON_SCALE = ("data.options.max_train=20000", "rounds=20", "eval.every=2")
TARGET = 0.5  # Oort's target: the example's, fixed before this grid (docs/baselines.md)

PAPER = {
    "moon_fedavg": "66.3 ± 0.5", "moon_fedprox": "66.9 ± 0.2", "moon": "69.1 ± 0.4",
    "qffl_q0": "var 724 %², mean 80.8 %", "qffl_q1": "var 472 %², mean 79.0 %",
}

NOTES = """\
**MOON.** The paper: 10 parties, Dir(0.5), every party every round, its simple CNN with a
2-layer projection head, 10 local epochs of batch 64, 100 rounds, SGD 0.01 with momentum 0.9
and weight decay 1e-5 for every method, μ = 5 and τ = 0.5 for MOON. Here
`examples/moon_cifar10.toml` as written (LeNet-5, z its 84-unit penultimate layer, the same
optimizer for all three methods, fedforge's MOON and FedProx defaults) with one local epoch,
cut for the CPU: a run of the example took about 30 s a round on the shared 2-core CPU
(a 30-round MOON run about 15 minutes), so every MOON condition trains on a fixed subset of
20,000 of the 50,000 training images (`data.options.max_train`) for 20 rounds, evaluated
every 2 rounds on the whole test set. This was fixed from that timing alone, before any
comparison was looked at. One local epoch and 20 rounds leave far less room for client drift
than the paper's 10 epochs and 100 rounds, which is what MOON's contrastive term corrects.
MOON logs no per-round diagnostic of that term, so the page shows its effect only through
the accuracy. A public cross-check of the paper's CIFAR-10 ordering: Flower's MOON baseline,
contributed by MOON's first author, reports 70.7 % for MOON and 68.5 % for FedProx after 100
rounds of the paper's setting (one run).

**q-FFL.** LEAF Synthetic(1, 1) with 100 clients and logistic regression, the paper's
Synthetic setting; 10 clients a round, one local epoch of batch 10 at η_l = 0.1, 200
rounds, each client's own held-out 20 % as its test set (`examples/qffl_synthetic.toml`).
q = 1 is the paper's q for Synthetic; q = 0 is the same q-FedAvg step with uniform weights
(FedAvg), the paper's baseline. The metric is the variance over clients of the global
model's accuracy on each client's test data (`global_accuracy_var`, in units of accuracy²:
the paper's 724 %² is 0.0724), averaged over the last 5 evaluations (rounds 180–200).

**Oort.** `examples/oort_time_to_accuracy.toml` as written: FedAvg on Synthetic(1, 1), 100
clients, 10 a round of 10 local steps, half the clients fast, 30 % three times and 20 % ten
times slower, every round waiting for all its clients; uniform sampling against Oort with
the official code's defaults, 300 rounds. The metric is the simulated time until the pooled
test accuracy first reaches 0.5, the example's target. A run that never reaches it within
its 300 rounds is censored at its budget and judged by the exact sign test. The diagnostics
show Oort's preferred round duration and its exploration factor.
"""


def _moon() -> tuple[Condition, ...]:
    return tuple(Condition(name, alg, MOON_SCALE, label=label, config=MOON)
                 for name, alg, label in (("moon_fedavg", "fedavg", "MOON setting: FedAvg"),
                                          ("moon_fedprox", "fedprox", "MOON setting: FedProx"),
                                          ("moon", "moon", "MOON setting: MOON")))


def _qffl() -> tuple[Condition, ...]:
    return (Condition("qffl_q0", "qffl", ("algorithm.q=0",), label="q-FFL setting: q = 0",
                      config=QFFL),
            Condition("qffl_q1", "qffl", ("algorithm.q=1",), label="q-FFL setting: q = 1",
                      config=QFFL))


def _oort() -> tuple[Condition, ...]:
    return (Condition("oort_uniform", "fedavg", ("server.sampler=uniform",),
                      label="Oort setting: uniform sampling", config=OORT),
            Condition("oort", "fedavg", ("server.sampler=oort",), label="Oort setting: Oort",
                      config=OORT))


def _comparisons() -> tuple[Comparison, ...]:
    """The four headline comparisons (primary) and what else the papers' tables show."""
    return (
        Comparison("moon", "moon_fedavg", "final_acc", ">", primary=True),
        Comparison("moon", "moon_fedprox", "final_acc", ">", primary=True),
        Comparison("qffl_q1", "qffl_q0", "final_client_var", "<", primary=True),
        Comparison("oort", "oort_uniform", "sim_time", "<", primary=True),
        Comparison("moon_fedprox", "moon_fedavg", "final_acc", kind="none",
                   note="Table 1: 66.9 vs 66.3, within a point"),
        Comparison("qffl_q1", "qffl_q0", "final_client_mean", kind="equivalence", margin=0.02,
                   note="a small cost: Table 2 shows 1.8 points on Synthetic"),
        Comparison("qffl_q1", "qffl_q0", "final_client_p10", ">",
                   note="Table 2: the worst 10 % gain"),
        Comparison("oort", "oort_uniform", "final_acc", kind="none",
                   note="after 300 rounds, not the paper's final accuracy at convergence"),
    )


@register("baselines")
def baselines_spec() -> Reproduction:
    moon, qffl, oort = _moon(), _qffl(), _oort()
    return Reproduction(
        name="baselines",
        claim=CLAIM,
        config=MOON,
        conditions=(*moon, *qffl, *oort),
        seeds=(0, 1, 2, 3, 4),
        target=TARGET,
        comparisons=_comparisons(),
        stages=(tuple(c.name for c in qffl), tuple(c.name for c in oort),
                tuple(c.name for c in moon)),
        diagnostics=("global_accuracy_var", "oort_preferred_duration_s", "oort_exploration"),
        panels=(("MOON: CIFAR-10 Dir(0.5)", tuple(c.name for c in moon)),
                ("q-FFL: Synthetic(1, 1)", tuple(c.name for c in qffl)),
                ("Oort: Synthetic(1, 1), heterogeneous speeds", tuple(c.name for c in oort))),
        paper=PAPER,
        paper_title="paper (MOON: Table 1 acc. %; q-FFL: Table 2, Synthetic)",
        notes=NOTES,
        effects={
            "final_acc": (0.01, "one accuracy point, a third of MOON's 2.2 to 2.8-point gain "
                          "in the paper's Table 1"),
            "final_client_var": (0.006, "60 %² of accuracy variance, a quarter of the "
                                 "paper's reduction on Synthetic (724 to 472 %²)"),
            "final_client_p10": (0.02, "two points of the 10th-percentile client's accuracy"),
            "sim_time": (35.0, "about 10 % of uniform sampling's simulated time to 0.5 "
                         "in the example's measured runs (≈ 350 s)"),
        },
        families_note=("Primary: MOON against FedAvg and against FedProx, q-FFL's variance "
                       "reduction and Oort's time to accuracy, one per paper's headline. "
                       "Exploratory: q-FFL's cost in mean accuracy and its 10th percentile, "
                       "FedProx against FedAvg, Oort's accuracy after 300 rounds. Declared "
                       "in the spec before any run (issue 56)."),
        title="Baselines: MOON, q-FFL, Oort",
        scale=(("MOON: parties, rounds, local epochs", "10, 20, 1",
                "10, 100, 10"),
               ("MOON: data, model", "20 000 CIFAR-10 training images, LeNet-5 (62 k)",
                "all 50 000, simple CNN + projection head"),
               ("q-FFL: clients (per round), model", "100 (10), logistic regression",
                "100 (10), logistic regression"),
               ("Oort: clients (per round), data", "100 (10), Synthetic(1, 1), logreg",
                "thousands to millions, real datasets and device traces")),
        caveats=(
            "MOON runs one local epoch for 20 rounds on 20 000 images, far less local drift "
            "than the paper's 10 epochs for 100 rounds.",
            "q-FFL and Oort run on a synthetic logistic-regression problem, not the "
            "papers' real datasets and device traces.",
            "q = 1 is still climbing at round 200 (seed 0: mean client accuracy 0.45 "
            "against 0.57 for q = 0), so its cost in mean accuracy here is mostly slower "
            "convergence, not the cost at the paper's converged models.",
            "MOON (μ = 5) learns more slowly than FedAvg here (seed 0: 0.32 against 0.45 "
            "after 20 rounds); one seed, so no verdict yet.",
        ),
        paper_commands=(
            f"fedforge compare {MOON} -a fedavg,fedprox,moon client.local_epochs=10 rounds=100 "
            "engine.device=cuda --seeds 0,1,2,3,4 --out runs/moon_paper",
        ),
        paper_compute=(
            "MOON at the paper's scale: 100 rounds × 10 local epochs over 50 000 CIFAR-10 "
            "images, about 50 M sample-passes per run (three forward passes each for MOON); "
            "minutes per run on one GPU, well under one GPU-hour for 3 methods × 5 seeds "
            "(an estimate, not measured). q-FFL and Oort run here at the examples' scale."
        ),
    )
