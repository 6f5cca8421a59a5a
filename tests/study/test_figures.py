"""Figures of ``compare`` and ``plot``: seeds averaged with a t-interval band, labels, styles
keyed by method, titles that fit, band and legend options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex, to_rgb
from PIL import Image
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.study.labels import axis_label
from fedforge.study.plots import (
    BAND_ALPHA,
    curves,
    draw,
    figure_title,
    load_run_list,
    plot_runs,
)
from fedforge.study.styles import COLORS, MARKERS, style_for, styles_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _close_figures():
    """``draw`` leaves its figure to the caller; these tests only look, then close."""
    yield
    plt.close("all")

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
    assert ax.get_ylabel() == "test accuracy\nglobal model, pooled test set"  # which model, data
    assert [c["color"] for c in data["curves"]] == [style_for(a).color for a in
                                                    ("fedavg", "scaffold", "fedprox")]
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


def _line_styles(fig) -> dict[str, tuple]:
    """label -> (colour, marker) of each drawn line, as the artists hold them."""
    return {ln.get_label(): (to_hex(ln.get_color()), ln.get_marker())
            for ax in fig.axes for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_colours_follow_the_method_not_the_run_order(tmp_path):
    dirs = {a: _run(tmp_path / a, a, 0, [0.1, 0.2]) for a in ("fedavg", "scaffold", "fedprox")}
    seen = []
    for order in (["fedavg", "scaffold", "fedprox"], ["fedprox", "scaffold", "fedavg"],
                  ["scaffold"]):
        fig, _ = draw(load_run_list([dirs[a] for a in order]))
        seen.append(_line_styles(fig))
    assert seen[0] == seen[1]
    assert seen[2]["scaffold (seed 0)"] == seen[0]["scaffold (seed 0)"]
    assert seen[0]["fedavg (seed 0)"] == (style_for("fedavg").color, style_for("fedavg").marker)


def test_style_is_fixed_by_the_name_in_every_process():
    from fedforge.algorithms import ALGORITHMS

    first = list(ALGORITHMS)[:7]  # registry order: fedavg, fedavgm, fedprox, scaffold, ...
    assert [style_for(a).color for a in first] == list(COLORS)
    assert [style_for(a).marker for a in first] == list(MARKERS[:7])
    assert style_for("fedavgm") == style_for("fedavg_server_momentum")  # an alias
    pairs = {(style_for(a).color, style_for(a).marker) for a in ALGORITHMS}
    assert len(pairs) == len(ALGORITHMS)  # no two built-in methods look alike
    # a name outside the registry: from SHA-256, not from Python's salted hash()
    code = "from fedforge.study.styles import style_for; print(style_for('fedavg_lo'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert other == str(style_for("fedavg_lo"))


def test_methods_drawn_together_get_distinct_colours_whatever_their_order():
    names = ["fedavg", "fedavg [lr_small]", "fedavg [lr_large]", "my_plugin", "scaffold"]
    styles = styles_for(names)
    assert styles == styles_for(reversed(names))
    assert len({s.color for s in styles.values()}) == len(names)
    assert styles["fedavg"] == style_for("fedavg")  # built-in names never move


LONG = """seed = {seed}
rounds = 2
[data]
dataset = "fashion_mnist"
partition = "dirichlet"
num_clients = 50
[data.partition_options]
alpha = 0.1
min_size = 10
[model]
name = "mlp"
[algorithm]
name = "{algo}"
[server]
clients_per_round = 10
"""


def _long_runs(root: Path, algos=("fedavg", "scaffold"), seeds=(0, 1, 2)) -> list:
    dirs = []
    for k, algo in enumerate(algos):
        for s in seeds:
            d = _run(root / algo / f"seed{s}", algo, s, [0.2 + 0.1 * k + 0.02 * s, 0.5, 0.7])
            (d / "config.resolved.toml").write_text(LONG.format(seed=s, algo=algo))
            dirs.append(d)
    return load_run_list(dirs)


def _outside_figure(fig) -> list[str]:
    """Titles, axis labels and legend texts of the drawn figure that reach past its edges
    (what a reader sees clipped); ``"everything"`` if the drawn artists do."""
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        if ax.get_legend() is not None:
            texts += [ax.get_legend().get_title(), *ax.get_legend().get_texts()]
    out = []
    for t in texts:
        if t.get_visible() and t.get_text().strip():
            e = t.get_window_extent(renderer)
            if e.x0 < box.x0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y0 < box.y0 - 0.5 or \
                    e.y1 > box.y1 + 0.5:
                out.append(t.get_text())
    tight, whole = fig.get_tightbbox(renderer), fig.bbox_inches
    if tight.x0 < -0.01 or tight.y0 < -0.01 or tight.x1 > whole.x1 + 0.01 or \
            tight.y1 > whole.y1 + 0.01:
        out.append("everything")
    return out


@pytest.mark.parametrize("bands", ["alpha", "off", "panels"])
def test_long_titles_wrap_inside_the_figure(tmp_path, bands):
    runs = _long_runs(tmp_path)
    title = figure_title(runs)
    assert title == ("fashion_mnist · dirichlet partition (α=0.1, min_size=10) · mlp · "
                     "10 of 50 clients per round")
    options = {} if bands == "alpha" else {"bands": bands}  # alpha: the default
    for text in (title, f"{title} · local_steps=5 · lr=0.05 · 3 seeds · 95 % t-interval"):
        fig, data = draw(runs, title=text, **options)
        assert _outside_figure(fig) == []
        assert data["title"] == text  # the JSON keeps it whole; only the drawing wraps
        shown = fig.get_suptitle()
        assert "\n" in shown and shown.replace("\n", " ").startswith("fashion_mnist")
    png = plot_runs(runs, tmp_path / "t.png", title=text, **options)
    img = np.asarray(Image.open(png).convert("L"))
    assert img[: img.shape[0] // 5, [0, 1, -2, -1]].min() > 250  # nothing touches the edge


def test_band_options(tmp_path):
    runs = _long_runs(tmp_path)
    for bands, panels, shaded in (("alpha", 1, 2), ("off", 1, 0), ("panels", 2, 2)):
        fig, data = draw(runs, bands=bands)
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert (len(axes), sum(len(ax.collections) for ax in axes)) == (panels, shaded), bands
        assert data["bands"] == bands
    fig, _ = draw(runs, bands="panels")
    for ax, algo in zip(fig.axes, ("fedavg", "scaffold")):
        colours = [to_hex(ln.get_color()) for ln in ax.get_lines()]
        assert sorted(colours) == sorted([style_for(algo).color, "#c7c7c7"])  # others grey
        assert ax.get_title().startswith(algo)
    with pytest.raises(ValueError, match="bands: expected one of alpha, off, panels"):
        draw(runs, bands="stripes")


def _covers(fig, ax, legend) -> bool:
    """Whether the legend box covers a point of a line (sampled along each segment) or of a
    shaded band."""
    fig.canvas.draw()
    box = legend.get_window_extent()
    for line in ax.get_lines():
        xy = line.get_transform().transform(np.column_stack([line.get_xdata(),
                                                             line.get_ydata()]))
        t = np.linspace(0, 1, 50)[None, :, None]
        pts = (xy[:-1, None, :] * (1 - t) + xy[1:, None, :] * t).reshape(-1, 2)
        if any(box.contains(px, py) for px, py in pts):
            return True
    grid = [(x, y) for x in np.linspace(box.x0, box.x1, 9) for y in np.linspace(box.y0, box.y1, 9)]
    return any(coll.get_transform().transform_path(p).contains_points(grid).any()
               for coll in ax.collections for p in coll.get_paths())


def _rising(root: Path, steps: int = 10) -> list:
    """Three methods climbing from the lower left to the upper right corner."""
    dirs = []
    for k, algo in enumerate(("fedavg", "scaffold", "fedprox")):
        for s in (0, 1):
            accs = [0.1 + 0.8 * r / steps + 0.02 * k + 0.01 * s for r in range(steps)]
            dirs.append(_run(root / algo / f"seed{s}", algo, s, accs))
    return load_run_list(dirs)


def test_legend_hides_no_data(tmp_path):
    runs = _rising(tmp_path)
    fig, data = draw(runs, legend="off", bands="off")
    ax = fig.axes[0]
    assert ax.get_legend() is None and data["legend"] == "off"
    assert _covers(fig, ax, ax.legend(loc="upper right"))  # the control: there it would
    for bands in ("alpha", "off"):
        for legend in ("best", "outside"):
            fig, data = draw(runs, bands=bands, legend=legend)
            ax = fig.axes[0]
            assert not _covers(fig, ax, ax.get_legend()), (bands, legend)
            assert data["legend"] in ({legend} if legend == "outside" else {"best", "outside"})
            assert _outside_figure(fig) == []  # an outside legend widens the figure


def test_crowded_axes_put_the_legend_outside(tmp_path):
    dirs = []
    for k, algo in enumerate(("fedavg", "scaffold", "fedprox", "fedadam")):
        accs = [0.1 + 0.8 * ((r * (k + 3)) % 7) / 6 for r in range(30)]  # zigzags everywhere
        dirs.append(_run(tmp_path / algo, algo, 0, accs))
    fig, data = draw(load_run_list(dirs), legend="best")
    assert data["legend"] == "outside"
    assert not _covers(fig, fig.axes[0], fig.axes[0].get_legend())
    assert _outside_figure(fig) == []


def test_per_seed_lines_keep_their_methods_colour(tmp_path):
    runs = _long_runs(tmp_path)
    fig, _ = draw(runs, average=False, bands="off")
    lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("fedavg")]
    assert {to_hex(ln.get_color()) for ln in lines} == {style_for("fedavg").color}
    assert len({str(ln.get_linestyle()) for ln in lines}) == 3


def test_cli_band_and_legend_options(tmp_path, monkeypatch):
    runs = _long_runs(tmp_path / "runs", seeds=(0, 1))
    args = [str(r.path) for r in runs]
    res = CliRunner().invoke(app, ["plot", *args, "--bands", "panels", "-o",
                                   str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "p.json").read_text())["bands"] == "panels"
    res = CliRunner().invoke(app, ["plot", *args, "--legend", "outside", "--bands", "off",
                                   "-o", str(tmp_path / "q.png")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "q.json").read_text())
    assert (data["bands"], data["legend"]) == ("off", "outside")
    res = CliRunner().invoke(app, ["plot", *args, "--bands", "stripes"])
    assert res.exit_code == 2 and "--bands: expected one of alpha, off, panels" in res.output

    # compare draws its figures inside the options (the runs themselves are not needed here)
    import fedforge.study.compare as compare

    def fake(cfgs, out, **_):
        return [{"algorithm": "fedavg", "seeds": 2}], plot_runs(runs, Path(out) / "accuracy.png")

    monkeypatch.setattr(compare, "run_comparison", fake)
    res = CliRunner().invoke(app, ["compare", str(REPO / "examples" / "quickstart.toml"), "-a",
                                   "fedavg", "-o", str(tmp_path / "cmp"), "--bands", "off",
                                   "--legend", "outside"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "cmp" / "accuracy.json").read_text())
    assert (data["bands"], data["legend"]) == ("off", "outside")


def test_accuracy_band_is_drawn_within_0_and_1(tmp_path):
    dirs = [_run(tmp_path / f"seed{s}", "fedavg", s, accs)
            for s, accs in enumerate([[0.0, 0.9], [0.5, 1.0], [0.9, 0.95]])]
    fig, data = draw(load_run_list(dirs))
    (curve,) = data["curves"]
    assert curve["ci_low"][0] < 0 and curve["ci_high"][1] > 1  # the JSON keeps the interval
    ys = np.concatenate([p.vertices[:, 1] for p in fig.axes[0].collections[0].get_paths()])
    assert ys.min() >= 0.0 and ys.max() <= 1.0
