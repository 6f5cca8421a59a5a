"""``fedforge report`` and ``plot`` output as a reader sees it: every seed's partition, each
method in its own colour whatever the run order, band options, and the page and a figure
rendered by headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.study.plots import load_run_list, plot_runs
from fedforge.study.report import write_report
from fedforge.study.styles import style_for

CONFIG = """seed = {seed}
rounds = 6
[data]
dataset = "synthetic"
partition = "dirichlet"
num_clients = 4
[data.partition_options]
alpha = 0.3
[model]
name = "logreg"
[algorithm]
name = "{algo}"
[server]
clients_per_round = 2
"""


def _partition(seed: int) -> dict:
    """A different draw per seed, as a Dirichlet partition gives."""
    sizes = [3 + seed, 5, 2 + 2 * seed, 4]
    counts = [[s - 1, 1] if i % 2 else [1, s - 1] for i, s in enumerate(sizes)]
    return {"dataset": "synthetic", "num_clients": 4, "num_classes": 2, "sizes": sizes,
            "label_counts": counts, "client_names": None}


def _folder(root: Path, algos=("fedavg", "scaffold"), seeds=(0, 1, 2), same_partition=False
            ) -> Path:
    """A compare --out folder written by hand (no table.json: the report builds its rows)."""
    for k, algo in enumerate(algos):
        for s in seeds:
            d = root / algo / f"seed{s}"
            d.mkdir(parents=True)
            recs = [{"round": r, "test_accuracy": 0.1 + 0.12 * r + 0.05 * k + 0.02 * s,
                     "test_loss": 2.0 / r, "sim_time_s": 3.0 * r} for r in range(1, 7)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
            (d / "config.resolved.toml").write_text(CONFIG.format(seed=s, algo=algo))
            part = _partition(0 if same_partition else s)
            (d / "partition.json").write_text(json.dumps(part))
    return root


class _Page(HTMLParser):
    """Images (alt, decoded PNG) and the partition list of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, bytes]] = []
        self.partitions: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            src = a.get("src") or ""
            self.images.append((a.get("alt") or "", base64.b64decode(src.split(",", 1)[-1])))
        if tag == "ul" and a.get("id") == "partitions" or tag == "li" and self._in:
            self._in.append(tag)
            if tag == "li":
                self.partitions.append("")

    def handle_endtag(self, tag):
        if self._in and tag == self._in[-1]:
            self._in.pop()

    def handle_data(self, data):
        if self._in and self._in[-1] == "li":
            self.partitions[-1] += data


def _page(folder: Path, **options) -> _Page:
    page = _Page()
    page.feed(write_report(folder, **options).read_text(encoding="utf-8"))
    return page


def _image(page: _Page, alt: str) -> np.ndarray:
    png = next(data for a, data in page.images if a.startswith(alt))
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def _pixels(img: np.ndarray, colour: str, tol: int = 6) -> int:
    """Pixels of exactly ``colour`` (line cores and markers), within ``tol`` per channel."""
    rgb = np.array([round(255 * c) for c in to_rgb(colour)])
    return int((np.abs(img - rgb).max(axis=-1) <= tol).sum())


def test_report_shows_every_seeds_partition(tmp_path):
    page = _page(_folder(tmp_path / "cmp"))
    assert [p.split(":")[0] for p in page.partitions] == ["seed 0", "seed 1", "seed 2"]
    # seed 1's sizes are 4 5 4 4 (17 samples), seed 2's 5 5 6 4 (20)
    assert "17 training samples" in page.partitions[1]
    assert "20 training samples" in page.partitions[2]
    sizes = _image(page, "client sizes")
    one = _image(_page(_folder(tmp_path / "one", seeds=(0,))), "client sizes")
    assert sizes.shape[0] > 1.8 * one.shape[0]  # a row of bars per seed
    # seeds that drew the same partition (a natural split) share one entry
    same = _page(_folder(tmp_path / "same", same_partition=True))
    assert [p.split(":")[0] for p in same.partitions] == ["seeds 0, 1, 2"]


def test_report_and_plot_colour_each_method_alike_whatever_the_run_order(tmp_path):
    both = _folder(tmp_path / "both", algos=("fedavg", "scaffold"), seeds=(0,))
    alone = _folder(tmp_path / "alone", algos=("scaffold",), seeds=(0,))
    fedavg, scaffold = style_for("fedavg").color, style_for("scaffold").color
    for folder in (both, alone):
        acc = _image(_page(folder), "test accuracy against round")
        png = plot_runs(load_run_list(sorted(folder.glob("*/seed0"))), folder / "acc.png")
        plotted = np.asarray(Image.open(png).convert("RGB")).astype(int)
        for img in (acc, plotted):
            assert _pixels(img, scaffold) > 100
            assert (_pixels(img, fedavg) > 100) == (folder is both)


def test_report_band_and_legend_options(tmp_path):
    folder = _folder(tmp_path / "cmp")
    alts = [a for a, _ in _page(folder, bands="panels").images]
    assert "test accuracy against round, one panel per method" in alts
    res = CliRunner().invoke(app, ["report", str(folder), "--bands", "off", "--legend", "off"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["report", str(folder), "--legend", "left"])
    assert res.exit_code == 2 and "--legend: expected one of best, outside, off" in res.output


def _browser() -> str | None:
    return next((p for n in ("chromium", "chromium-browser", "google-chrome")
                 if (p := shutil.which(n))), None)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
           "--window-size=1200,900", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(_browser() is None, reason=(
    "no headless Chromium on PATH; on Debian `apt-get install chromium` provides "
    "/usr/bin/chromium; the other tests here still check the page and the figures"))
def test_page_and_figure_as_chromium_renders_them(tmp_path):
    folder = _folder(tmp_path / "cmp")
    page = write_report(folder)
    png = plot_runs(load_run_list(sorted(folder.glob("*/seed*"))), folder / "accuracy.png",
                    title="fashion_mnist · dirichlet partition (α=0.1, min_size=10) · mlp · "
                          "10 of 50 clients per round · 3 seeds")
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    parsed = _Page()
    parsed.feed(dom)  # the DOM as the browser built it
    assert len(parsed.images) == 5 and all(d[:8] == b"\x89PNG\r\n\x1a\n" for _, d in
                                          parsed.images)
    assert [p.split(":")[0] for p in parsed.partitions] == ["seed 0", "seed 1", "seed 2"]
    for target, name in ((page, "page.png"), (png, "figure.png")):
        shot = tmp_path / name
        _chromium(tmp_path, f"--screenshot={shot}", target.as_uri())
        img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        assert img.shape[:2] == (900, 1200)
        assert img.std() > 10  # not a blank page
        # the figures were decoded and drawn: both methods' line colours are on screen
        for algo in ("fedavg", "scaffold"):
            assert _pixels(img, style_for(algo).color) > 30, (name, algo)
