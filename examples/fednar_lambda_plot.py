import json, pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
def acc(name):
    p = pathlib.Path("runs/fednar") / name / "metrics.jsonl"
    r = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    return r[-1]["test_accuracy"] * 100
lams = [0.001, 0.05, 1.0]
names = {0.05: "fedavg_a0.3_nar{}", 0.001: "fedavg_a0.3_wd0.001_nar{}", 1.0: "fedavg_a0.3_wd1.0_nar{}"}
fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
for nar, lab, m in (("true", "FedNAR (decay inside the clip)", "o-"), ("false", "vanilla (clip g, decay after)", "s--")):
    ax[0].plot(lams, [acc(names[l].format(nar)) for l in lams], m, label=lab)
ax[0].set_xscale("log"); ax[0].set_xlabel("λ (initial weight decay)"); ax[0].set_ylabel("test accuracy (%)")
ax[0].set_title("fedforge, CPU scale: CIFAR-10 α=0.3,\nCNN(4,8), 10 rounds, 10/100 clients, K=20", fontsize=9)
ax[0].legend(fontsize=8)
# authors' dev logs (ljb121002/fednar first commit, ResNet-18-GN, 2000 rounds), FedAvg alpha=0.3
base = {1e-4: 80.5, 1e-3: 80.8, 1e-2: 84.4, 3e-2: 88.4, 5e-2: 87.3, 1e-1: 80.4}
nar = {1e-2: 83.4, 3e-2: 87.4, 5e-2: 88.3, 1e-1: 87.5, 0.5: 21.9}
ax[1].plot(list(nar), list(nar.values()), "o-", label="FedNAR")
ax[1].plot(list(base), list(base.values()), "s--", label="vanilla")
ax[1].set_xscale("log"); ax[1].set_xlabel("λ"); ax[1].set_title("authors' dev logs (not the paper's tables):\nResNet-18-GN, 2000 rounds, 20/100 clients", fontsize=9)
ax[1].legend(fontsize=8)
fig.tight_layout(); fig.savefig("docs/fednar_lambda.png", dpi=110)
