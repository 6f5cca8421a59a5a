"""Every default hyper-parameter of every method, with where it comes from.

A default that silently drifts from its source changes every run that relies on it, so each
one is written here, and only here, with its source: ``paper`` (with the section or table),
``official code`` (with the repository and file) or ``ours`` (with the reason). The built-in
factories are written without defaults and take them from this table through
:func:`defaults_from`; ``fedforge algorithms --params NAME`` prints it and
``docs/algorithms.md`` is generated from it
(``python -m fedforge.algorithms.defaults docs/algorithms.md``).

The table imports nothing of fedforge: the factories read it while the registry loads, and
the queries that need the registry (every method with its kind, the docs page) are
``fedforge.algorithms.methods``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

PAPER, CODE, OURS = "paper", "official code", "ours"
SOURCES = (PAPER, CODE, OURS)


@dataclass(frozen=True)
class Default:
    """One default value, the kind of its source and the exact place (or our reason)."""

    value: object
    source: str
    ref: str


def paper(value: object, ref: str) -> Default:
    return Default(value, PAPER, ref)


def code(value: object, ref: str) -> Default:
    return Default(value, CODE, ref)


def ours(value: object, reason: str) -> Default:
    return Default(value, OURS, reason)


# --- citations used more than once ----------------------------------------------------------
REDDI = "Reddi et al. 2021 (Adaptive Federated Optimization)"
FADAMGC = "Chen et al. (FAdamGC)"
FEDNAR_CODE = "ljb121002/fednar scripts/*.sh (CIFAR-10)"
SAFL = "Chen, Li & Banerjee (SAFL)"
SAFL_CODE = "lucmonl/mlopt main.py"
FEDPTR = "Chen et al. 2023 (FedPTR)"
FEDAST = "Askin et al. 2024 (FedAST)"
FEDAST_CODE = "askinb/FedAST"
FEDNOVA_CODE = "JYWa/FedNova"
FAIR_CODE = "litian96/fair_flearn"
IFCA_CODE = "jichan3751/ifca"
CFL_CODE = "felisat/clustered-federated-learning"
MOON_CODE = "QinbinLi/MOON"
FLORA_CODE = "ATP-1010/FederatedLLM"
FEDGEN_CODE = "zhuangdizhu/FedGen"


def _sgd_client(lr: Default | None = None) -> dict[str, Default]:
    """The local-optimizer knobs every SGD-family backbone shares."""
    return {
        "local_lr": lr or code(0.01, f"{FEDNAR_CODE}: η_l = 0.01 for every backbone"),
        "client_optimizer": paper("sgd", "McMahan et al. 2017, Alg. 1: local SGD"),
        "weight_decay": ours(0.0, "no L2 decay unless a config sets it; the papers tune λ "
                                  "per dataset"),
        "max_grad_norm": ours(None, "no clipping unless asked; nar=true alone uses the "
                                    "FedNAR code's A = 10"),
        "nar": ours(False, "FedNAR's co-clipped decay (Li et al. 2023) is opt-in on every "
                           "SGD backbone"),
    }


def _adam_server(lr: Default, b2: Default | None = None, tau_name: str = "tau",
                 tau: Default | None = None) -> dict[str, Default]:
    return {
        "server_lr": lr,
        "b1": paper(0.9, f"{REDDI}, Sec. 5: β1 = 0.9"),
        "b2": b2 or paper(0.99, f"{REDDI}, Sec. 5: β2 = 0.99"),
        tau_name: tau or paper(1e-3, f"{REDDI}, Sec. 5: τ = 1e-3"),
    }


_FEDOPT_LR = ours(1e-2, "Reddi et al. tune η per task; 1e-2 is FAdamGC Table 5's FedAdam "
                        "value on 20NewsGroups")
_FADAMGC_ADAM = {
    "b1": paper(0.9, f"{FADAMGC}, Sec. 6 (experiments): β1 = 0.9 for all Adam optimizers"),
    "b2": paper(0.99, f"{FADAMGC}, App. G Table 3: the default β2 = 0.99 (against β2 = 0)"),
    "eps": paper(1e-8, f"{FADAMGC}, Sec. 6 (experiments): ε = 1e-8 for all Adam optimizers"),
}
_FADAMGC_LRS = {
    "local_lr": paper(1e-3, f"{FADAMGC}, App. H Table 4: η_l = 1e-3 on CIFAR-10/100"),
    "server_lr": paper(1.0, f"{FADAMGC}, App. H Table 4: η_g = 1 on CIFAR-10/100"),
}
_TRACKING = paper(0.5, f"{FADAMGC}, Sec. 6 (experiments): S̃ = S/2 on the image tasks")
_TRACKING_INIT = ours("zeros", "Alg. 1 gives no initial y, y_i; zeros keep y = mean_i y_i with "
                      "no warm-up; 'full_gradient' is the theory's y_i = ∇f_i(x¹) (Thm 5.2 proof)")
_MOMENTUM_BASELINE = {
    "local_lr": paper(1e-2, f"{FADAMGC}, App. H Table 4: FedAvg-M/SCAFFOLD-M η_l = 1e-2"),
    "server_lr": paper(1.0, f"{FADAMGC}, App. H Table 4: FedAvg-M/SCAFFOLD-M η_g = 1"),
    "beta": ours(0.1, "the FAdamGC paper gives no β; 0.1 lies in Cheng et al. 2023's "
                      "recommended range"),
}
_FEDPTR_LOCAL = {
    "local_lr": paper(0.01, f"{FEDPTR}, Sec. 5.1: SGD lr 0.01 for every method"),
    "local_momentum": paper(0.5, f"{FEDPTR}, Sec. 5.1: momentum 0.5 (read only with "
                                 "client_optimizer='momentum')"),
    "weight_decay": ours(0.0, "the FedPTR paper states no weight decay"),
}
_FEDPTR = {
    **_FEDPTR_LOCAL,
    "client_optimizer": paper("momentum", f"{FEDPTR}, Sec. 5.1: SGD with momentum"),
    "lam": paper(0.05, f"{FEDPTR}, Sec. 5.1: λ = 0.05"),
    "adaptive": paper(True, f"{FEDPTR}, App. B.1: layer-adaptive λ_j = λ/||w_j - w̃_j||"),
    "window": ours(2, "the paper leaves m open (docs/fedptr.md, open point 1)"),
    "ipc": paper(10, f"{FEDPTR}, Table 3: 100 synthetic images for 10 classes"),
    "outer_steps": paper(20, f"{FEDPTR}, Sec. 5.1: H = 20"),
    "inner_steps": paper(10, f"{FEDPTR}, Sec. 5.1: R = 10"),
    "syn_lr": paper(0.01, f"{FEDPTR}, Sec. 5.1: β₀ = 0.01"),
    "lr_img": code(1000.0, "GeorgeCazenavette/mtt-distillation distill.py: lr_img"),
    "lr_lr": code(1e-5, "GeorgeCazenavette/mtt-distillation distill.py: lr_lr"),
    "proj_steps": paper(5, f"{FEDPTR}, Sec. 5.1: K = 5 projection steps"),
    "proj_lr": ours(0.01, "the paper leaves the projection lr open; the local lr of Sec. 5.1"),
    "mtt_every": paper(1, f"{FEDPTR}, Alg. 2: D̃ refitted every round (Table 7 varies it)"),
    "augment": ours(False, "the paper does not say whether MTT's DSA was used "
                           "(docs/fedptr.md)"),
    "eval_projected_every": ours(0, "a diagnostic: score the projected model w̃ on the test "
                                   "set every N rounds (0 = never)"),
}
_UPLINK_DIAGNOSTICS = {
    "diagnostics_window": ours(0, "a diagnostic: log the decode error and the top-k energy of "
                                 "the last N mean deltas (0 = off)"),
}
_COMPRESSED_CLIENT = {
    "local_lr": ours(0.01, "the library's SGD local lr; the SAFL author code's ResNet runs "
                           "use 0.1, its ViT runs 0.01"),
    "client_optimizer": paper("sgd", f"{SAFL}, Alg. 1: K local SGD steps"),
    "weight_decay": code(0.0, f"{SAFL_CODE}: clients train with wd 0 (notebook run paths)"),
}
_SAFL_ADAM = {
    "server_lr": paper(1e-2, f"{SAFL}, App. (experiments): Adam lr 0.01"),
    "b1": paper(0.9, f"{SAFL}, App. (experiments): momentum 0.9"),
    "b2": ours(0.99, "the SAFL paper states no β2; the FedOpt convention (Reddi et al. 2021)"),
    "eps": ours(1e-3, "the FedAdam τ; with 1e-8 the first steps are ≈ sign(u) and flip with "
                      "float reduction order (docs/safl.md)"),
}
_COMPRESSION = ours(100.0, "d/b = 100 is the SAFL paper's 99 % compression point "
                           "(App. D: b = 4e5 for d ≈ 4e7)")
_SEED = ours(0, "any fixed seed; shared randomness is rebuilt from (seed, round)")

PFLLIB = "TsingZ0/PFLlib system/"
FLBENCH = "KarhouTam/FL-bench"
FEDPROTO_CODE = "yuetan031/FedProto"
_HEAD = ours(None, "the model's body/head split: [model] head, else the model's last layer "
                   "(every zoo model declares it)")
_FT_STEPS = ours(10, "PFLlib's FedBABU fine-tunes 10 epochs (main.py: fine_tuning_epochs); "
                     "fedforge counts steps so every client costs the same at evaluation")

ALGORITHM_DEFAULTS: dict[str, dict[str, Default]] = {
    "fedavg": {
        **_sgd_client(),
        "server_lr": paper(1.0, "McMahan et al. 2017, Alg. 1: plain averaging = server lr 1 "
                                f"({REDDI}, Sec. 2)"),
        "local_momentum": ours(0.9, "torch's usual heavy-ball β, read only with "
                                    "client_optimizer='momentum'"),
    },
    "fedavg_server_momentum": {
        **_sgd_client(),
        "client_optimizer": paper("sgd", "McMahan et al. 2017, Alg. 1: local SGD (FedAvgM "
                                                "changes the server only)"),
        "server_lr": code(1.0, "ljb121002/fednar main.py (FedAvgM): x <- x + m"),
        "server_momentum": code(0.9, "ljb121002/fednar main.py (FedAvgM): m <- Δ̄ + 0.9 m"),
    },
    "fedprox": {
        **_sgd_client(),
        "mu": paper(0.01, "Li et al. 2020, Sec. 5: μ from the grid {0.001, 0.01, 0.1, 1}"),
        "server_lr": paper(1.0, "Li et al. 2020, Alg. 2: plain averaging"),
    },
    "scaffold": {
        **{k: v for k, v in _sgd_client().items() if k != "client_optimizer"},
        "server_lr": paper(1.0, "Karimireddy et al. 2020, Sec. 7: η_g = 1 in the experiments"),
    },
    "fedadam": {
        **_sgd_client(),
        **_adam_server(_FEDOPT_LR),
        "adam_rule": paper("textbook", f"{REDDI}, Alg. 2: v from Δ², no bias correction"),
    },
    "fedyogi": {**_sgd_client(), **_adam_server(_FEDOPT_LR)},
    "fedadagrad": {
        **_sgd_client(),
        "server_lr": _FEDOPT_LR,
        "tau": paper(1e-3, f"{REDDI}, Sec. 5: τ = 1e-3"),
    },
    "fedams": {
        **_sgd_client(ours(0.01, "the FedOpt backbones' local lr; FAdamGC Table 4 tunes "
                                 "FedAMS η_l per task")),
        "server_lr": paper(1e-2, f"{FADAMGC}, App. H Table 5: FedAMS η_g = 1e-2 on "
                                 "20NewsGroups"),
        "b1": _FADAMGC_ADAM["b1"],
        "b2": _FADAMGC_ADAM["b2"],
        "eps": paper(1e-8, f"{FADAMGC}, Sec. 6 (experiments): ε = 1e-8, the v̂ floor of "
                           "Wang et al. 2022, Alg. 2"),
    },
    "fedexp": {
        **_sgd_client(),
        "eps": code(1e-3, "Divyansh03/FedExP main.py: epsilon_fedexp = 0.001 on CIFAR-10 "
                          "(FedNAR's scripts pass 0)"),
    },
    "fadamgc": {**_FADAMGC_LRS, **_FADAMGC_ADAM, "tracking_fraction": _TRACKING,
                "tracking_init": _TRACKING_INIT},
    "fa_nt": {**_FADAMGC_LRS, **_FADAMGC_ADAM, "tracking_fraction": _TRACKING,
              "tracking_init": _TRACKING_INIT},
    "localadam": {
        **_FADAMGC_LRS,
        **_FADAMGC_ADAM,
        "amsgrad": paper(True, f"{FADAMGC}, Alg. 1 with y = 0: AMSGrad max v̂"),
        "bias_correction": paper(False, f"{FADAMGC}, Alg. 1: no bias correction"),
        "carry_v": paper(True, f"{FADAMGC}, Alg. 1: v_i kept per client across rounds"),
    },
    "fedavg_global_momentum": dict(_MOMENTUM_BASELINE),
    "scaffold_m": dict(_MOMENTUM_BASELINE),
    "feddyn": {
        **_FEDPTR_LOCAL,
        "client_optimizer": paper("sgd", "Acar et al. 2021, Alg. 1: local SGD"),
        "alpha": paper(0.01, "Acar et al. 2021, Sec. 5: α from the grid {0.1, 0.01, 0.001}"),
    },
    "feddc": {
        **_FEDPTR_LOCAL,
        "client_optimizer": paper("sgd", "Gao et al. 2022, Alg. 1: local SGD"),
        "alpha": code(0.01, "gaoliang13/FedDC example_code_cifar10.py: alpha_coef = 1e-2"),
    },
    "fedptr": dict(_FEDPTR),
    "fedptr_s": dict(_FEDPTR),
    "safl": {
        **_COMPRESSED_CLIENT,
        **_UPLINK_DIAGNOSTICS,
        **_SAFL_ADAM,
        "rounds": ours(None, "no cosine decay without a horizon; set it to the run's rounds"),
        "min_lr": paper(1e-5, f"{SAFL}, App. (experiments): cosine schedule to 1e-5"),
        "optimizer": paper("amsgrad", f"{SAFL}, Alg. 2: AMSGrad without bias correction"),
        "sketch": code("srht", f"{SAFL_CODE}: SRHT of the flattened delta"),
        "sketch_size": ours(None, "given as the compression ratio d/b instead"),
        "compression": _COMPRESSION,
        "sketch_rows": ours(1, "rows matter for the count sketch only"),
        "sketch_seed": _SEED,
    },
    "fetchsgd": {
        **_COMPRESSED_CLIENT,
        **_UPLINK_DIAGNOSTICS,
        "server_lr": paper(1.0, f"{SAFL}, App. (experiments): SGD and SGDm use lr 1.0"),
        "momentum": paper(0.9, f"{SAFL}, App. (experiments): SGDm momentum 0.9"),
        "sketch_size": ours(None, "given as the compression ratio d/b instead"),
        "compression": _COMPRESSION,
        "sketch_rows": code(5, f"{SAFL_CODE}: csvec count sketch with r = 5 rows"),
        "k": ours(None, "a tenth of the sketch columns: k = d/compression diverged "
                        "(docs/safl.md)"),
        "topk_compression": ours(None, "k is given directly or by its default"),
        "sketch_seed": _SEED,
    },
    "topk_ef": {
        **_COMPRESSED_CLIENT,
        **_UPLINK_DIAGNOSTICS,
        **_SAFL_ADAM,
        "optimizer": ours("adam", "server Adam, as the SAFL paper's compressed baselines"),
        "method": ours("topk", "top-k is the classic error-feedback compressor"),
        "k": ours(None, "given as the compression ratio d/k instead"),
        "compression": _COMPRESSION,
        "levels": ours(16, "QSGD levels, read only with method='qsgd': 4 bits per entry"),
        "error_feedback": paper(True, "Karimireddy et al. 2019 (EF-SGD), Alg. 2"),
        "seed": _SEED,
    },
    "onebit_adam": {
        **_COMPRESSED_CLIENT,
        **_SAFL_ADAM,
        "error_feedback": paper(True, "Tang et al. 2021 (1-bit Adam), Alg. 1: error "
                                      "compensation"),
    },
    "marina": {
        **_COMPRESSED_CLIENT,
        **_UPLINK_DIAGNOSTICS,
        **_SAFL_ADAM,
        "server_lr": paper(1.0, f"{SAFL}, App. (experiments): SGD methods use lr 1.0"),
        "optimizer": paper("sgd", "Gorbunov et al. 2021, Alg. 1: x <- x - γ g"),
        "k": ours(None, "given as the compression ratio d/k instead"),
        "compression": _COMPRESSION,
        "sync_prob": ours(0.1, "a full synchronisation every ~10 rounds on average"),
        "seed": _SEED,
    },
    "fednova": {
        "local_lr": ours(0.01, "the library's SGD local lr; train_LocalSGD.py's --lr 0.1 is "
                               "the FedNova code's CIFAR-10 value"),
        "local_momentum": code(0.0, f"{FEDNOVA_CODE} train_LocalSGD.py: --momentum 0 (the "
                                    "paper's Sec. 6 also runs ρ = 0.9)"),
        "mu": code(0.0, f"{FEDNOVA_CODE} train_LocalSGD.py: --mu 0 (no proximal term)"),
        "weight_decay": _sgd_client()["weight_decay"],
        "server_lr": code(1.0, f"{FEDNOVA_CODE} distoptim/FedNova.py average(): "
                               "x <- x - τ_eff Σ p_i d_i"),
        "server_momentum": code(0.0, f"{FEDNOVA_CODE} train_LocalSGD.py: --gmf 0"),
    },
    "qffl": {
        "local_lr": code(0.01, f"{FAIR_CODE} run.sh: --learning_rate=0.01"),
        "q": code(5.0, f"{FAIR_CODE} README.md: q = 5 for q-FedAvg on Vehicle (q = 0 is "
                       "FedAvg)"),
    },
    "afl": {
        "local_lr": code(0.1, f"{FAIR_CODE} README.md (AFL on Adult): --learning_rate=0.1"),
        "lambda_lr": code(0.1, f"{FAIR_CODE} README.md (AFL on Adult): "
                               "--learning_rate_lambda=0.1"),
        "server_lr": code(1.0, f"{FAIR_CODE} flearn/trainers/afl.py: x <- x - η Σ λ_k g_k, "
                               "the local step's η only"),
        "average_iterates": code(True, f"{FAIR_CODE} flearn/trainers/afl.py: the evaluated "
                                       "resulting_model is the mean of the iterates (the "
                                       "paper's w^A)"),
    },
    "ifca": {
        "local_lr": code(0.1, f"{IFCA_CODE} mnist/train_cluster_mnist.py: --lr 0.1"),
        "num_clusters": code(4, f"{IFCA_CODE} mnist/config.json: p = 4 (rotated MNIST)"),
        "seed": ours(0, "seeds the fresh initialisations of clusters 1..K-1 (cluster 0 is "
                        "the run's initial model)"),
        "client_optimizer": code("sgd", f"{IFCA_CODE} mnist/train_cluster_mnist.py: "
                                        "local_param_update, plain gradient steps"),
        "weight_decay": ours(0.0, "the code's local step has none"),
        "max_grad_norm": ours(None, "the code clips nothing"),
        "nar": ours(False, "FedNAR's co-clipped decay is opt-in"),
    },
    "cfl": {
        "local_lr": code(0.1, f"{CFL_CODE} clustered_federated_learning.ipynb: "
                              "optimizer_fn SGD(lr=0.1, momentum=0.9); its momentum is not "
                              "kept (docs/baselines.md)"),
        "eps1": code(0.4, f"{CFL_CODE} clustered_federated_learning.ipynb: EPS_1 = 0.4"),
        "eps2": code(1.6, f"{CFL_CODE} clustered_federated_learning.ipynb: EPS_2 = 1.6"),
        "warmup_rounds": code(20, f"{CFL_CODE} clustered_federated_learning.ipynb: a split "
                                  "only when c_round > 20"),
        "max_clusters": ours(8, "the code has no cap; the server keeps a fixed number of "
                                "model slots so a checkpoint's shapes never change"),
        "client_optimizer": ours("sgd", "plain local SGD, as IFCA and FedAvg here"),
        "weight_decay": ours(0.0, "the code's optimizer has none"),
        "max_grad_norm": ours(None, "the code clips nothing"),
        "nar": ours(False, "FedNAR's co-clipped decay is opt-in"),
    },
    "moon": {
        "local_lr": code(0.01, f"{MOON_CODE} README.md: --lr=0.01 (Li et al. 2021, Sec. 4.1: "
                               "SGD lr 0.01 for every method)"),
        "local_momentum": code(0.9, f"{MOON_CODE} main.py: optim.SGD(momentum=0.9)"),
        "weight_decay": code(1e-5, f"{MOON_CODE} main.py: --reg 1e-5 (SGD weight_decay)"),
        "mu": code(5.0, f"{MOON_CODE} README.md: --mu=5 on CIFAR-10 (Li et al. 2021, Sec. 4.1: "
                        "μ = 5 on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet)"),
        "temperature": code(0.5, f"{MOON_CODE} main.py: --temperature 0.5 (Li et al. 2021, "
                                 "Sec. 4.1: τ = 0.5)"),
        "head": ours(None, "z is the head's input: [model] head, else the model's last layer "
                           "(the code's 2-layer projection head is not added; docs/baselines.md)"),
    },
    "flora": {
        "local_lr": code(3e-5, f"{FLORA_CODE} main.py: local_learning_rate = 3e-5"),
        "ranks": code([], f"{FLORA_CODE} main.py: heter = False, every client lora_r (the "
                          "heterogeneous runs set local_ranks = [64, 32, 16, 16, 8, 8, 4, 4, "
                          "4, 4], client i its i-th)"),
        "seed": ours(0, "seeds each round's fresh A (the code draws it from torch's global "
                        "generator); round 1 starts from the model's own A"),
        "client_optimizer": code("adam", f"{FLORA_CODE} fed_utils/client.py: "
                                         "optim='adamw_torch' with the Trainer's weight "
                                         "decay 0, which is Adam"),
        "weight_decay": code(0.0, f"{FLORA_CODE} fed_utils/client.py: TrainingArguments "
                                  "sets none (the Trainer's default 0)"),
        "max_grad_norm": code(1.0, f"{FLORA_CODE} fed_utils/client.py: TrainingArguments "
                                   "keeps the Trainer's default max_grad_norm = 1.0"),
    },
    "fedgen": {
        "local_lr": code(0.01, f"{FEDGEN_CODE} README.md: --learning_rate 0.01 (the code "
                               "also decays every method's local lr by 0.99 per round; "
                               "docs/baselines.md)"),
        "alpha": code(10.0, f"{FEDGEN_CODE} utils/model_config.py: RUNCONFIGS['mnist'] "
                            "generative_alpha = 10 (the teacher term's weight)"),
        "beta": code(10.0, f"{FEDGEN_CODE} utils/model_config.py: RUNCONFIGS['mnist'] "
                           "generative_beta = 10 (the latent KL term's weight; 1 on EMNIST)"),
        "decay": code(0.98, f"{FEDGEN_CODE} FLAlgorithms/users/userpFedGen.py: "
                            "exp_lr_scheduler(glob_iter, decay=0.98) of α and β, floor 1e-4"),
        "gen_batch_size": code(32, f"{FEDGEN_CODE} main.py: --gen_batch_size 32 (latents "
                                   "per local step)"),
        "generator_lr": code(3e-4, f"{FEDGEN_CODE} utils/model_config.py: RUNCONFIGS['mnist'] "
                                   "ensemble_lr = 3e-4 (Adam, betas 0.9, 0.999)"),
        "generator_lr_decay": code(0.98, f"{FEDGEN_CODE} FLAlgorithms/servers/serverpFedGen.py: "
                                         "ExponentialLR(gamma=0.98), stepped every round"),
        "generator_weight_decay": code(1e-2, f"{FEDGEN_CODE} utils/model_config.py: "
                                             "RUNCONFIGS['mnist'] weight_decay = 1e-2 (Adam's)"),
        "generator_steps": code(50, f"{FEDGEN_CODE} FLAlgorithms/servers/serverpFedGen.py: "
                                    "ensemble_epochs // n_teacher_iters = 10 epochs x 5 iters"),
        "generator_batch_size": code(32, f"{FEDGEN_CODE} FLAlgorithms/servers/serverpFedGen.py: "
                                         "train_generator(self.batch_size), --batch_size 32"),
        "eta": code(1.0, f"{FEDGEN_CODE} utils/model_config.py: RUNCONFIGS['mnist'] "
                         "ensemble_eta = 1 (the diversity loss's weight)"),
        "noise_dim": code(32, f"{FEDGEN_CODE} utils/model_config.py: GENERATORCONFIGS['mnist'] "
                              "noise_dim = 32"),
        "hidden_dim": code(256, f"{FEDGEN_CODE} utils/model_config.py: "
                                "GENERATORCONFIGS['mnist'] hidden_dimension = 256"),
        "label_weighting": code("batch", f"{FEDGEN_CODE} FLAlgorithms/servers/serverpFedGen.py: "
                                         "mean(NLL [B] * weight [B, 1]), a product of batch "
                                         "means; 'sample' weights each sample"),
        "seed": ours(0, "seeds the generator's initial weights and, with the round, the "
                        "server's draws of labels and noise"),
        "head": ours(None, "the latents are the head's input: [model] head, else the model's "
                           "last layer (the code's decode_fc2)"),
    },
    **{  # personalised FL (algorithms/personal, docs/personalised.md)
        "local_only": _sgd_client(),
        "fedavg_ft": {**_sgd_client(), "finetune_steps": _FT_STEPS},
        "ditto": {
            **_sgd_client(),
            "lam": code(1.0, f"{FLBENCH} src/server/ditto.py: --lamda 1 (the paper tunes λ "
                             "per dataset from a grid)"),
            "personal_passes": code(1, f"{PFLLIB} main.py: plocal_epochs = 1 (Ditto's "
                                       "personal epochs); FL-bench's pers_epoch = 1"),
        },
        "fedper": {**_sgd_client(), "head": _HEAD},
        "fedrep": {
            **_sgd_client(),
            "head_passes": code(1, f"{PFLLIB} main.py: plocal_epochs = 1, the head epochs of "
                                   "clientrep.py before the body's"),
            "head": _HEAD,
        },
        "fedbabu": {
            **_sgd_client(),
            "finetune_steps": _FT_STEPS,
            "finetune_lr": ours(None, "none: local_lr, as PFLlib's FedBABU (10 epochs at its "
                                      "training rate 0.005); the official FedBABU code "
                                      "fine-tunes at 1e-3 after training at 0.1"),
            "finetune_part": code("all", f"{PFLLIB} clientbabu.py: fine_tune(which_module="
                                         "['base', 'head']), body and head"),
            "head": _HEAD,
        },
        "lg_fedavg": {**_sgd_client(), "head": _HEAD},
        "apfl": {
            **_sgd_client(),
            "alpha": code(0.5, f"{FLBENCH} src/server/apfl.py: --alpha 0.5 (the paper runs "
                               "α ∈ {0.25, 0.5, 0.75} and adaptive)"),
            "adaptive_alpha": code(True, f"{FLBENCH} src/server/apfl.py: --adaptive_alpha 1; "
                                         "MLOPTPSU/FedTorch fed_adaptive_alpha"),
            "alpha_lr": ours(None, "none: local_lr, as MLOPTPSU/FedTorch flow_utils.py "
                                   "alpha_update steps α with the local learning rate"),
        },
        "pfedme": {
            **_sgd_client(),
            "personal_lr": code(0.01, f"{PFLLIB} main.py: p_learning_rate = 0.01; "
                                      "FL-bench's pers_lr = 0.01"),
            "lam": code(15.0, f"{FLBENCH} src/server/pfedme.py: --lamda 15"),
            "inner_steps": code(5, f"{PFLLIB} main.py: K = 5; FL-bench's k = 5"),
            "mu": code(0.0, f"{PFLLIB} main.py: mu = 0 (the paper's inner problem has no "
                            "decay; FL-bench adds mu = 1e-3)"),
            "beta": code(1.0, f"{FLBENCH} src/server/pfedme.py: --beta 1 (plain averaging)"),
        },
        "per_fedavg_fo": {
            **_sgd_client(),
            "beta": code(1e-3, f"{FLBENCH} src/server/perfedavg.py: --beta 1e-3"),
            "finetune_steps": paper(1, "Fallah et al. 2020, Sec. 2: a user's model is one "
                                       "gradient step w - α∇f_i(w) from the meta-model"),
        },
        "per_fedavg_hf": {
            **_sgd_client(),
            "beta": code(1e-3, f"{FLBENCH} src/server/perfedavg.py: --beta 1e-3"),
            "delta": code(1e-3, f"{FLBENCH} src/server/perfedavg.py: --delta 1e-3"),
            "finetune_steps": paper(1, "Fallah et al. 2020, Sec. 2: a user's model is one "
                                       "gradient step w - α∇f_i(w) from the meta-model"),
        },
        "fedrod": {**_sgd_client(), "head": _HEAD},
        "fedala": {
            **_sgd_client(),
            "eta": code(1.0, f"{PFLLIB} main.py: eta = 1.0"),
            "rand_percent": code(80.0, f"{PFLLIB} main.py: rand_percent = 80"),
            "layer_idx": code(2, f"{PFLLIB} main.py: layer_idx = 2 (the last two parameter "
                                 "tensors)"),
        },
        "fedbn": {
            **_sgd_client(),
            "norm": ours(None, "the zoo model's normalisation layers "
                               "(algorithms/personal/fedbn.py NORM_LAYERS); a model without "
                               "them trains as FedAvg"),
        },
        "fedproto": {
            "local_lr": code(0.01, f"{FEDPROTO_CODE} README.md: --lr 0.01"),
            "lam": code(1.0, f"{FEDPROTO_CODE} README.md: --ld 1 (MNIST, FEMNIST; 0.1 for "
                             "CIFAR-10)"),
            "weights": paper("samples", "Tan et al. 2022, Eq. 6: each client's prototype "
                                        "weighted by its class count (the code's "
                                        "proto_aggregation averages clients: 'clients')"),
            "client_optimizer": code("momentum", f"{FEDPROTO_CODE} lib/update.py: "
                                                 "torch.optim.SGD(momentum=0.5)"),
            "local_momentum": code(0.5, f"{FEDPROTO_CODE} README.md: --momentum 0.5"),
            "weight_decay": ours(0.0, "the code's SGD has none"),
            "max_grad_norm": _sgd_client()["max_grad_norm"],
            "nar": _sgd_client()["nar"],
            "head": _HEAD,
        },
    },
}


# --- asynchronous and multi-task methods (a multi-task config's `method`) -------------------
ASYNC, SYNC_BASELINE = "async", "multi-task baseline"

_REQUESTS = code(96, f"{FEDAST_CODE} fedast_het_demo.json: nb_of_active_works = 96 per task")
_RB = code(32.0, f"{FEDAST_CODE} server.py: R_bs_ratio = 32")
_BUFFER = ours(None, "b from R/rb_ratio; set it to fix b for every task")
_MAX_BATCH = ours(64, "jobs per vmapped call; changes speed only, never the result "
                      "(tests/schedulers/test_jobs.py)")
_K = paper(30, f"{FEDAST}, App. D.1: the first k = 30 updates per task are kept")
_PER_ROUND = ours(None, "the availability cap (system.available_fraction of the clients)")

_TASK_CLIENT = {  # what a task leaves unset in tasks[].client, for every multi-task method
    "client.batch_size": code(32, f"{FEDAST_CODE}: the clients' DataLoader batches of B = 32"),
    "client.local_steps": code(27, f"{FEDAST_CODE}: 3 local epochs of 9 batches (300 samples "
                                   "per client, B = 32) per request"),
}

ASYNC_DEFAULTS: dict[str, dict[str, Default]] = {
    "fedast": {
        "async.requests": _REQUESTS,
        "async.rb_ratio": _RB,
        "async.buffer_size": _BUFFER,
        "async.variance_window": paper(8, f"{FEDAST}, Alg. 4 and App. A: V = 8 updates per task"),
        "async.c_period_factor": paper(0.75, f"{FEDAST}, App. A: c_period = 0.75 M Σ R_m"),
        "async.min_requests": ours(1, "a floor of one request; the code's 32 is the "
                                      "paper-scale example's value"),
        "async.max_batch": _MAX_BATCH,
        "async.allocation": ours("paper", "the paper's Realloc (Alg. 3-4); \"code\" follows "
                                          "the authors' server.py instead "
                                          "(schedulers/allocation_code.py)"),
    },
    "fedast_static": {"async.requests": _REQUESTS, "async.rb_ratio": _RB,
                      "async.buffer_size": _BUFFER, "async.max_batch": _MAX_BATCH},
    "fedast_uniform": {"async.requests": _REQUESTS, "async.rb_ratio": _RB,
                       "async.buffer_size": _BUFFER, "async.max_batch": _MAX_BATCH},
    "fedast_nobuffer": {"async.requests": _REQUESTS, "async.max_batch": _MAX_BATCH},
    "fedbuff": {"async.requests": _REQUESTS, "async.rb_ratio": _RB,
                "async.buffer_size": _BUFFER, "async.max_batch": _MAX_BATCH},
    "fedasync": {
        "async.requests": _REQUESTS,
        "async.fedasync_alpha": paper(0.6, "Xie et al. 2019, Sec. 6: mixing α = 0.6"),
        "async.fedasync_a": paper(0.5, "Xie et al. 2019, Sec. 6: polynomial staleness "
                                       "(1 + s)^-a, a = 0.5"),
        "async.max_batch": _MAX_BATCH,
    },
}
"""The asynchronous methods' ``[async]`` options (``schedulers/fedast.py`` runs them)."""

BASELINE_DEFAULTS: dict[str, dict[str, Default]] = {
    "sync_st": {"sync.k": _K, "sync.clients_per_round": _PER_ROUND},
    "sync_st_nosm": {"sync.clients_per_round": _PER_ROUND},
    "sync_ucb_st": {
        "sync.k": _K,
        "sync.clients_per_round": _PER_ROUND,
        "sync.ucb_c": ours(0.5, "exploration weight of our per-task UCB simplification "
                                "(docs/fedast.md)"),
    },
    "sequential": {"sync.k": _K, "sync.clients_per_round": _PER_ROUND},
}
"""The multi-task baselines' ``[sync]`` options (``schedulers/multitask_sync.py`` runs them)."""

METHOD_DEFAULTS: dict[str, dict[str, Default]] = {
    name: {**_TASK_CLIENT, **options}
    for name, options in {**ASYNC_DEFAULTS, **BASELINE_DEFAULTS}.items()}
"""Every multi-task method's options: its ``[async]`` or ``[sync]`` table and the client
work of its tasks (``client.*``)."""
METHOD_KINDS: dict[str, str] = {**dict.fromkeys(ASYNC_DEFAULTS, ASYNC),
                                **dict.fromkeys(BASELINE_DEFAULTS, SYNC_BASELINE)}
"""Every multi-task method -> its kind, in the order ``fedforge algorithms`` lists them."""

OORT_CODE = "SymbioticLab/Oort"
POC = "Cho, Wang & Joshi 2022 (Power-of-Choice)"

SAMPLER_DEFAULTS: dict[str, dict[str, Default]] = {
    "power_of_choice": {
        "d": ours(None, "none = 2m, twice server.clients_per_round; the paper sweeps d from m "
                        "(random selection by size) up to K, and d = m is plain sampling"),
        "variant": paper("pow-d", f"{POC}, Sec. 4: pow-d ranks the d candidates by the "
                                  "global model's loss on their whole local data"),
        "batch": ours(None, "cpow-d's mini-batch per candidate; none = client.batch_size"),
    },
    "oort": {
        "exploration_factor": code(0.9, f"{OORT_CODE} training/argParser.py: "
                                        "--exploration_factor 0.9 (ε at the start)"),
        "exploration_decay": code(0.95, f"{OORT_CODE} training/argParser.py: "
                                        "--exploration_decay 0.95 per round"),
        "exploration_min": code(0.2, f"{OORT_CODE} training/argParser.py: --exploration_min 0.2"),
        "round_threshold": code(10.0, f"{OORT_CODE} training/argParser.py: --round_threshold "
                                      "10 (T = the 10th percentile of the clients' durations)"),
        "round_penalty": code(2.0, f"{OORT_CODE} training/argParser.py: --round_penalty 2.0 "
                                   "(the paper's α)"),
        "pacer_step": code(20, f"{OORT_CODE} training/argParser.py: --pacer_step 20 rounds"),
        "pacer_delta": code(5.0, f"{OORT_CODE} training/argParser.py: --pacer_delta 5 "
                                 "percentile points"),
        "cut_off_util": code(0.7, f"{OORT_CODE} training/argParser.py: --cut_off_util 0.7"),
        "sample_window": code(5.0, f"{OORT_CODE} training/argParser.py: --sample_window 5.0"),
        "clip_bound": code(0.98, f"{OORT_CODE} training/argParser.py: --clip_bound 0.98"),
    },
}
"""The client samplers' ``server.sampler_options`` (``sim/selection.py``, ``sim/oort.py``)."""
SAMPLER_DESCRIPTIONS = {
    "power_of_choice": "Power-of-Choice (Cho et al. 2022): d candidates drawn by data size, the "
                       "m of highest local loss train; the loss of pow-d (whole data), cpow-d "
                       "(a mini-batch) or rpow-d (the last reported training loss)",
    "oort": "Oort (Lai et al. 2021): exploit by |B_i|·√(mean loss²) + staleness bonus, × "
            "(T/t_i)^α when slower than the preferred duration T; ε-greedy exploration by "
            "size; the pacer relaxes T when utility stalls",
}
SAMPLER = "sampler"

METHOD_DESCRIPTIONS = {
    "fedast": "FedAST (Askin et al. 2024): buffered async, dynamic request allocation",
    "fedast_static": "FedAST(S): static allocation with the configured requests per task",
    "fedast_uniform": "FedAST(S) uniform: equal requests per task",
    "fedast_nobuffer": "FedAST without a buffer (b = 1), uniform allocation",
    "fedbuff": "FedBuff (Nguyen et al. 2022): buffer b, staleness weight (1+s)^-1/2",
    "fedasync": "FedAsync (Xie et al. 2019): b = 1, mixing α (1+s)^-a",
    "sync_st": "Sync-ST (Bhuyan et al. 2023): random split of each round's clients",
    "sync_st_nosm": "Sync-ST waiting for every client (no straggler mitigation)",
    "sync_ucb_st": "Sync-UCB-ST: clients per task by a UCB index of the training loss",
    "sequential": "one task at a time with all of the round's clients",
}


# --- the factories read their defaults from the table ---------------------------------------
F = TypeVar("F", bound=Callable[..., object])


def defaults_from(name: str, tables: dict[str, dict[str, Default]] | None = None
                  ) -> Callable[[F], F]:
    """Give algorithm ``name``'s factory, written without defaults, the table's values.

    The values land in the function's own ``__defaults__``/``__kwdefaults__``, so
    ``inspect.signature``, config validation and ``fedforge config --defaults`` see them as
    ordinary defaults. A table key that is not a parameter, a parameter the table misses, or a
    default written in the signature as well raises at import: each value is stated once.
    """
    def apply(factory: F) -> F:
        params = inspect.signature(factory).parameters.values()
        table = _table_for(name, factory, params, tables)
        factory.__defaults__ = tuple(table[p.name] for p in params
                                     if p.kind is p.POSITIONAL_OR_KEYWORD) or None
        factory.__kwdefaults__ = {p.name: table[p.name] for p in params
                                  if p.kind is p.KEYWORD_ONLY} or None
        return factory

    return apply


def _table_for(name: str, factory: Callable, params,
               tables: dict[str, dict[str, Default]] | None = None) -> dict[str, object]:
    """``name``'s defaults (key -> value), once checked against ``factory``'s parameters."""
    where = f"defaults_from({name!r}) on {factory.__qualname__}"
    tables = ALGORITHM_DEFAULTS if tables is None else tables
    if name not in tables:
        raise TypeError(f"{where}: no table entry named {name!r}")
    table = {key: d.value for key, d in tables[name].items()}
    names = [p.name for p in params]
    extra, missing = sorted(set(table) - set(names)), sorted(set(names) - set(table))
    twice = [p.name for p in params if p.default is not p.empty]
    odd = [p.name for p in params if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for problem, keys in (("parameters that cannot take a default", odd),
                          ("table keys that are not parameters", extra),
                          ("parameters without a table entry", missing),
                          ("defaults written in the signature too", twice)):
        if keys:
            raise TypeError(f"{where}: {problem}: {keys}")
    return table


def table_value(name: str, key: str) -> object:
    """The table's default of ``key`` for algorithm ``name`` (for the parts a factory builds)."""
    return ALGORITHM_DEFAULTS[name][key].value


def show(value: object) -> str:
    """A default as a config would spell it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)
