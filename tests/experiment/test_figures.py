"""Figures of ``compare`` and ``plot``: seeds averaged with a t-interval band, labels, styles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment.labels import axis_label
from fedforge.experiment.plots import (
    BAND_ALPHA,
    PALETTE,
    curves,
    draw,
    figure_title,
    load_run_list,
    plot_runs,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = """seed = {seed}
rounds = 2
[data]
dataset = "synthetic"
partition = "dirichlet"
num_clients = 20
[data.partition_options]
alpha = 0.3
[model]
name = "logreg"
[algorithm]
name = "{algo}"
[server]
clients_per_round = 5
"""


def _run(folder: Path, algo: str | None, seed: int, accs: list[float]) -> Path:
    folder.mkdir(parents=True)
    recs = [{"round": r, "test_accuracy": a, "sim_time_s": 10.0 * r}
            for r, a in enumerate(accs, 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if algo is not None:
        (folder / "config.resolved.toml").write_text(CONFIG.format(seed=seed, algo=algo))
    return folder


def test_seeds_are_averaged_with_a_t_interval(tmp_path):
    dirs = [_run(tmp_path / "fedavg" / f"seed{s}", "fedavg", s, accs)
            for s, accs in enumerate([[0.5, 0.6], [0.6, 0.6], [0.7, 0.6]])]
    dirs.append(_run(tmp_path / "scaffold" / "seed0", "scaffold", 0, [0.2, 0.3]))
    fedavg, scaffold = curves(load_run_list(dirs), "test_accuracy")
    assert fedavg.label == "fedavg (mean of 3 seeds)" and scaffold.label == "scaffold (seed 0)"
    # round 1: 0.5, 0.6, 0.7 -> mean 0.6, sd 0.1, half width t_{0.975,2} 0.1/√3 = 4.3027 * 0.0577
    assert fedavg.mean[0] == pytest.approx(0.6) and fedavg.n == [3, 3]
    assert fedavg.ci_low[0] == pytest.approx(0.6 - 0.248414, abs=1e-5)
    assert fedavg.ci_high[0] == pytest.approx(0.6 + 0.248414, abs=1e-5)
    assert fedavg.ci_low[1] == pytest.approx(0.6)  # identical seeds: a band of width 0
    assert scaffold.ci_low == [None, None]  # one seed: no interval
    per_seed = curves(load_run_list(dirs), "test_accuracy", average=False)
    assert [c.label for c in per_seed] == ["fedavg (seed 0)", "fedavg (seed 1)",
                                           "fedavg (seed 2)", "scaffold (seed 0)"]


def test_runs_without_config_keep_their_distinguishing_folders(tmp_path):
    a = _run(tmp_path / "fedavg" / "seed0", None, 0, [0.1, 0.2])
    b = _run(tmp_path / "scaffold" / "seed0", None, 0, [0.3, 0.4])
    labels = [c.label for c in curves(load_run_list([a, b]), "test_accuracy")]
    assert labels == ["fedavg/seed0", "scaffold/seed0"]


def test_title_styles_labels_and_vector_pdf(tmp_path):
    dirs = [_run(tmp_path / a, a, 0, [0.1, 0.2]) for a in ("fedavg", "scaffold", "fedprox")]
    runs = load_run_list(dirs)
    assert figure_title(runs) == ("synthetic · dirichlet partition (α=0.3) · logreg · "
                                  "5 of 20 clients per round")
    fig, data = draw(runs, "test_accuracy", "sim_time_s")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len({ln.get_color() for ln in lines}) == 3 == len({ln.get_marker() for ln in lines})
    assert len({str(ln.get_linestyle()) for ln in lines}) == 3
    assert ax.get_xlabel() == "simulated time (s)" == axis_label("sim_time_s")
    assert ax.get_ylabel() == "test accuracy"
    assert [c["color"] for c in data["curves"]] == list(PALETTE[:3])
    png = plot_runs(runs, tmp_path / "fig" / "acc.png")
    assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
    assert json.loads(png.with_suffix(".json").read_text())["title"] == figure_title(runs)


def test_unknown_metric_lists_the_available_ones(tmp_path):
    runs = load_run_list([_run(tmp_path / "a", "fedavg", 0, [0.1])])
    with pytest.raises(ValueError, match=r"metric 'bogus'.*available: round, sim_time_s"):
        plot_runs(runs, tmp_path / "x.png", y="bogus")
    assert not (tmp_path / "x.png").exists()


def test_compare_help_shows_the_table_name():
    res = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0
    assert "[compare.ALGORITHM]" in res.output and "````" not in res.output


def _band_pixels(png: Path, color: str) -> int:
    """Pixels of the band's colour over white (alpha-blended), within 3 levels per channel."""
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    band = np.array([round(255 * (1 - BAND_ALPHA + BAND_ALPHA * c)) for c in to_rgb(color)])
    return int((np.abs(img - band).max(axis=-1) <= 3).sum())


def test_compare_with_three_seeds_draws_the_band(tmp_path):
    out = tmp_path / "cmp"
    res = CliRunner().invoke(app, [
        "compare", str(REPO / "examples" / "quickstart.toml"), "-a", "fedavg", "--seeds",
        "0,1,2", "-q", "-o", str(out), "rounds=3", "eval.every=1", "client.local_steps=2",
        "client.local_epochs=null", "checkpoint.every=3"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((out / "table.json").read_text())
    assert row["seeds"] == 3 and row["final_acc"]["n"] == 3
    assert isinstance(row["final_acc"]["mean"], float)
    finals = [json.loads((out / "fedavg" / f"seed{s}" / "metrics.jsonl").read_text()
                         .splitlines()[-1])["test_accuracy"] for s in range(3)]
    assert row["final_acc"]["mean"] == pytest.approx(np.mean(finals))
    assert row["final_acc"]["std"] == pytest.approx(np.std(finals, ddof=1))
    header = (out / "table.csv").read_text().splitlines()[0].split(",")
    assert {"final_acc_mean", "final_acc_ci_low", "final_acc_n"} <= set(header)
    (curve,) = json.loads((out / "accuracy.json").read_text())["curves"]
    assert curve["n"] == [3, 3, 3] and curve["label"] == "fedavg (mean of 3 seeds)"
    assert all(lo < hi for lo, hi in zip(curve["ci_low"], curve["ci_high"]))
    assert (out / "accuracy.pdf").is_file()
    band = _band_pixels(out / "accuracy.png", curve["color"])
    # control: the same figure of one seed has no band, only the line's anti-aliased edges
    one = plot_runs(load_run_list([out / "fedavg" / "seed0"]), tmp_path / "one.png")
    assert band > 20 * max(1, _band_pixels(one, curve["color"]))


def test_same_algorithm_with_other_settings_is_another_line(tmp_path):
    dirs = []
    for sweep, lr in (("lr_small", 0.01), ("lr_large", 0.1)):
        for s in (0, 1):
            d = _run(tmp_path / sweep / f"seed{s}", "fedavg", s, [0.1 + lr, 0.2])
            (d / "config.resolved.toml").write_text(CONFIG.format(seed=s, algo="fedavg").replace(
                'name = "fedavg"', f'name = "fedavg"\nlocal_lr = {lr}'))
            dirs.append(d)
    labels = [c.label for c in curves(load_run_list(dirs), "test_accuracy")]
    assert labels == ["fedavg [lr_small] (mean of 2 seeds)", "fedavg [lr_large] (mean of 2 seeds)"]
