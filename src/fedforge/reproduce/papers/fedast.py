"""FedAST (Askin et al., UAI 2024): simultaneous asynchronous training of 4 tasks, Sec. 5.4."""

from __future__ import annotations

from fedforge.reproduce.spec import Comparison, Condition, Reproduction, register

CLAIM = (
    "FedAST reaches every task's target accuracy sooner in simulated time than synchronous "
    "simultaneous training with straggler mitigation (Sync-ST) and than training the tasks "
    "one after another. Askin, Sharma, Joe-Wong, Joshi, *FedAST: Federated Asynchronous "
    "Simultaneous Training*, UAI 2024, Sec. 5.4, Fig. 6/7 (MNIST, FMNIST, CIFAR-10, "
    "Shakespeare; 1000 clients, 300 available; all four targets at 619 vs ≈ 1033 for "
    "Sync-ST: a gain of 40.1 %)."
)

# Sync-ST as in the paper: server learning rate 1 (FedAST's buffered step uses 0.3 at
# R/b = 8), and an evaluation every 2 rounds = every 12 kept updates per task, the same
# update spacing as FedAST's every 4 rounds of b = 3.
SYNC = ("tasks.algorithm.server_lr=1.0", "tasks.eval_every=2")
HIGHER_TARGETS = ("tasks.0.target=0.92", "tasks.1.target=0.65", "tasks.2.target=0.42",
                  "tasks.3.target=0.34")
DOUBLE_SCALE = ("system.num_clients=400", "async.requests=48", "async.rb_ratio=16")

NOTES = """\
**Scale.** The paper's four task types on two shared CPU cores: MNIST with the authors'
784-200-200-10 MLP, Fashion-MNIST with the authors' LeNet-5 (`variant = "code"`: no padding,
ReLU output), CIFAR-10 with a narrow 2-conv CNN (8/16 channels, FC 64), Shakespeare with a
one-layer char-LSTM (embedding 8, 32 units, 20-character windows, ≤ 96 windows per role).
200 clients (the paper: 1000), 30 % available (60 busy at most; Sync-ST 60 clients per
round, 15 per task, the first 6 kept: the paper's 30 of 75), Dir(0.1) with 300 samples per
client, the paper's speed classes and shifted-exponential delays with its per-step times
(0.148 / 0.240 / 0.228 / 0.555). One epoch of full batches per request (`drop_last`, the
authors' local loop; τ = 9 instead of 27). FedAST: 24 requests per task (96 in flight
against 60 available clients; the paper 384 against 300), b = 3 (R/b = 8), η_s = 0.3;
Sync-ST and sequential: η_s = 1. Local learning rates 0.1 / 0.06 / 0.1 / 1.5, weight decay
3e-4 / 3e-4 / 7e-4 / 1e-5 (the authors' demo; Shakespeare's rate is lower for the smaller
LSTM). Test accuracy on 2000 evenly spaced test samples of each task (every 5th).

**Targets** (0.91 / 0.62 / 0.40 / 0.33) are below the paper's (0.93 / 0.82 / 0.63 / 0.42)
so that a run fits the CPU budget while every task needs more than 50 Sync-ST rounds. They
were fixed from one Sync-ST calibration run (seed 0) before any comparison ran:
`fedforge run examples/fedast_4tasks_cpu.toml method=sync_st tasks.algorithm.server_lr=1.0
tasks.eval_every=2 tasks.target=null max_updates=2400` (100 rounds; raw metrics in
`docs/data/fedast/calibration/`). Rule: each task's target is the smallest whole point
above the best accuracy Sync-ST reached in its first 50 rounds (0.9005, 0.6105, 0.3975,
0.3265), so Sync-ST first reaches them at rounds 66, 52, 86 and 54 in that run. The
ablation stage reruns FedAST and Sync-ST at higher targets (0.92 / 0.65 / 0.42 / 0.34,
still below the calibration run's best, 0.933 / 0.690 / 0.443 / 0.354) to show how the gain
depends on them.

**Explaining the sign.** The core conditions are FedAST with the paper's allocation rules,
FedAST with the authors' code's rules (`async.allocation = "code"`, docs/fedast.md) and
Sync-ST. The ablations change one thing at a time: Sync-ST without straggler mitigation;
constant delays (no exponential tail, so stragglers cost Sync-ST little); higher targets;
twice the clients and requests (R/b = 16).
"""


def _conditions() -> tuple[Condition, ...]:
    """The core (FedAST with the paper's and the code's allocation rules, Sync-ST), the other
    schedules, and the ablations that change one thing at a time."""
    return (
        Condition("fedast", "fedast", label="FedAST(D), paper rules"),
        Condition("fedast_code", "fedast", ("async.allocation=code",),
                  label="FedAST(D), authors' code rules"),
        Condition("sync_st", "sync_st", SYNC, label="Sync-ST (first k kept)"),
        Condition("fedast_static", "fedast_static", label="FedAST(S), static R"),
        Condition("fedbuff", "fedbuff", label="FedBuff (per task)"),
        Condition("sequential", "sequential", SYNC, label="Sequential"),
        Condition("sync_st_nosm", "sync_st_nosm", SYNC, label="Sync-ST, no straggler mitigation"),
        Condition("fedast_const", "fedast", ("system.delay=constant",),
                  label="FedAST(D), constant delays"),
        Condition("sync_st_const", "sync_st", (*SYNC, "system.delay=constant"),
                  label="Sync-ST, constant delays"),
        Condition("fedast_hi", "fedast", HIGHER_TARGETS, label="FedAST(D), higher targets"),
        Condition("sync_st_hi", "sync_st", (*SYNC, *HIGHER_TARGETS),
                  label="Sync-ST, higher targets"),
        Condition("fedast_x2", "fedast", DOUBLE_SCALE, label="FedAST(D), 400 clients, R = 48"),
        Condition("sync_st_x2", "sync_st", (*SYNC, "system.num_clients=400", "sync.k=12"),
                  label="Sync-ST, 400 clients, k = 12"),
    )


def _comparisons() -> tuple[Comparison, ...]:
    """The paper's two headline claims (primary: FedAST sooner than Sync-ST and than the
    tasks one after another), the same with the code's rules, and the controls."""
    return (
        Comparison("fedast", "sync_st", "sim_time", "<", primary=True),
        Comparison("fedast_code", "sync_st", "sim_time", "<"),
        Comparison("fedast", "sequential", "sim_time", "<", primary=True),
        Comparison("fedast_code", "sequential", "sim_time", "<"),
        Comparison("fedast", "fedast_static", "sim_time", "<"),
        Comparison("fedast", "fedbuff", "sim_time", "<"),
        Comparison("sync_st", "sync_st_nosm", "sim_time", "<"),
        Comparison("fedast_const", "sync_st_const", "sim_time", "<"),
        Comparison("fedast_hi", "sync_st_hi", "sim_time", "<"),
        Comparison("fedast_x2", "sync_st_x2", "sim_time", "<"),
    )


@register("fedast")
def fedast_spec() -> Reproduction:
    return Reproduction(
        name="fedast",
        claim=CLAIM,
        config="examples/fedast_4tasks_cpu.toml",
        conditions=_conditions(),
        seeds=(0, 1, 2),
        target=None,  # each task has its own target in the config
        multitask=True,
        gain_baseline="sync_st",
        stages=(("fedast", "fedast_code", "sync_st"),
                ("fedast_static", "fedbuff", "sequential"),
                ("sync_st_nosm", "fedast_const", "sync_st_const", "fedast_hi", "sync_st_hi"),
                ("fedast_x2", "sync_st_x2")),
        comparisons=_comparisons(),
        curves=("fedast", "fedast_code", "sync_st", "fedast_static", "fedbuff", "sequential"),
        paper={"fedast": "619 (gain 40.1 %)", "sync_st": "≈ 1033"},
        paper_title="paper: time to all 4 targets",
        notes=NOTES,
        effects={"sim_time": (25.0, "about 10 % of Sync-ST's simulated time to every target "
                              "here, a quarter of the paper's 40 % gain")},
        families_note=("Primary: the paper's two headline claims with its own allocation "
                       "rules. The authors' code rules duplicate them and are exploratory, "
                       "like the controls. Declared after the runs had finished (issue 55)."),
        title="FedAST",
        scale=(("clients (available)", "200 (30 %)", "1000 (300)"),
               ("tasks", "4 (MNIST, FMNIST, CIFAR-10, Shakespeare)", "the same 4"),
               ("model parameters", "MLP 199 k, LeNet-5, CNN (8/16, FC 64), LSTM 32",
                "MLP 199 k, LeNet-5, CNN (1600→384→192 FC), LSTM 100"),
               ("requests in flight", "96 against 60 available", "384 against 300")),
        caveats=(
            "A fifth of the paper's clients and a smaller CIFAR-10 CNN and LSTM; the "
            "targets were set from a Sync-ST pilot.",
            "The gain over Sync-ST (8 %) is a fifth of the paper's 40 %.",
        ),
        ablations=(
            ("Straggler mitigation of the baseline", ("sync_st", "sync_st_nosm")),
            ("Delay law: shifted exponential vs constant",
             ("fedast", "sync_st", "fedast_const", "sync_st_const")),
            ("Targets", ("fedast", "sync_st", "fedast_hi", "sync_st_hi")),
            ("Scale", ("fedast", "sync_st", "fedast_x2", "sync_st_x2")),
        ),
        paper_commands=(
            "fedforge run examples/fedast_4tasks.toml method=fedast engine.device=cuda "
            "--out runs/fedast_4tasks/fedast",
            "fedforge run examples/fedast_4tasks.toml method=fedast async.allocation=code "
            "engine.device=cuda --out runs/fedast_4tasks/fedast_code",
            "fedforge run examples/fedast_4tasks.toml method=sync_st "
            "tasks.algorithm.server_lr=1.0 engine.device=cuda --out runs/fedast_4tasks/sync_st",
        ),
        paper_compute=(
            "the paper's runs: ≈ 40 k–60 k client updates of 27 steps per method (1000 "
            "clients, CIFAR-10 CNN with 1600→384→192 FC, Shakespeare LSTM 100): about 1–2 "
            "GPU-hours per run on one A100, ≈ 30 GPU-hours for 6 methods × 3 seeds."
        ),
    )
