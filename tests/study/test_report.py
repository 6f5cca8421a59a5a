"""``fedforge report``: a self-contained HTML page, checked by a parser and a headless browser;
partition statistics (``partition.json``) counted by hand."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.data import FederatedDataset
from fedforge.experiment.partition_stats import partition_stats, save_partition_stats
from fedforge.study.report import write_report

CONFIG = """seed = {seed}
rounds = 2
[data]
dataset = "synthetic"
partition = "natural"
[model]
name = "logreg"
[algorithm]
name = "{algo}"
[server]
clients_per_round = 2
"""
PARTITION = {"dataset": "synthetic", "num_clients": 3, "num_classes": 3, "sizes": [2, 2, 1],
             "label_counts": [[1, 1, 0], [0, 1, 1], [1, 0, 0]], "client_names": None}


def _data(vocab: int | None = None) -> FederatedDataset:
    x = torch.zeros(5, 4)
    y = torch.tensor([0, 1, 1, 2, 0])
    idx = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4])]
    return FederatedDataset(x, y, x[:1], y[:1], idx, None, 3, (4,), "toy", vocab_size=vocab)


def test_partition_stats_by_hand(tmp_path):
    stats = partition_stats(_data())
    assert stats["sizes"] == [2, 2, 1]
    assert stats["label_counts"] == [[1, 1, 0], [0, 1, 1], [1, 0, 0]]  # y = 0 1 | 1 2 | 0
    # next-token task (labels = the vocabulary): sizes only
    assert partition_stats(_data(vocab=3))["label_counts"] is None
    path = save_partition_stats(_data(), tmp_path)
    assert json.loads(path.read_text())["num_clients"] == 3
    assert not list(tmp_path.glob("*.tmp"))


def _compare_folder(root: Path) -> Path:
    """A compare --out folder written by hand: fedavg with seeds 0, 1 and scaffold."""
    for algo, seed, accs in (("fedavg", 0, [0.4, 0.6]), ("fedavg", 1, [0.5, 0.8]),
                             ("scaffold", 0, [0.3, 0.9])):
        d = root / algo / f"seed{seed}"
        d.mkdir(parents=True)
        recs = [{"round": r, "test_accuracy": a, "test_loss": 1 - a, "sim_time_s": 5.0 * r}
                for r, a in enumerate(accs, 1)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "config.resolved.toml").write_text(CONFIG.format(seed=seed, algo=algo))
        (d / "partition.json").write_text(json.dumps(PARTITION))
    rows = [{"algorithm": "fedavg", "seeds": 2,
             "final_acc": {"mean": 0.7, "std": 0.1414, "n": 2, "ci_low": -0.57,
                           "ci_high": 1.97}},
            {"algorithm": "scaffold", "seeds": 1,
             "final_acc": {"mean": 0.9, "std": None, "n": 1, "ci_low": None, "ci_high": None}}]
    (root / "table.json").write_text(json.dumps(rows))
    return root


class _Page(HTMLParser):
    """Tags, attributes and text of a page, to check it without a browser."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self._in_title = False
        self.title = ""

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_title:
            self.title += data


def _cells(page: _Page) -> str:
    return " ".join(t.strip() for t in page.text if t.strip())


def test_report_is_self_contained_html(tmp_path):
    folder = _compare_folder(tmp_path / "cmp")
    res = CliRunner().invoke(app, ["report", str(folder)])
    assert res.exit_code == 0, res.output
    page = _Page()
    page.feed((folder / "report.html").read_text(encoding="utf-8"))
    assert page.title == "fedforge report: cmp"
    imgs = [a for t, a in page.tags if t == "img"]
    # curves: accuracy, loss (vs round), accuracy vs simulated time; partition: sizes, heatmap
    assert len(imgs) == 5
    for a in imgs:
        prefix = "data:image/png;base64,"
        assert a["src"].startswith(prefix)
        assert base64.b64decode(a["src"][len(prefix):])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [t for t, a in page.tags if t in ("script", "link", "iframe")]
    assert not [a for _, a in page.tags if any(str(v).startswith("http") for v in a.values())]
    text = _cells(page)
    # table.json: 0.7 ± (1.97 - -0.57) / 2 = 1.27; scaffold one seed: the mean alone
    assert "0.7 ± 1.3" in text and "0.9" in text
    assert "3 clients, 5 training samples" in text
    assert 'name = "scaffold"' in text  # the configs
    assert "synthetic · natural partition · logreg · 2 of 3 clients per round" in text


def test_report_refuses_a_folder_without_runs(tmp_path):
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "no metrics.jsonl" in res.output


def _browser() -> str | None:
    return next((p for n in ("chromium", "chromium-browser", "google-chrome")
                 if (p := shutil.which(n))), None)


@pytest.mark.skipif(_browser() is None, reason=(
    "no headless Chromium on PATH; on Debian `apt-get install chromium` provides "
    "/usr/bin/chromium (the playwright pip package cannot download its own browser "
    "offline); the parser test above still checks the page"))
def test_report_in_a_headless_browser(tmp_path):
    folder = _compare_folder(tmp_path / "cmp")
    page = write_report(folder)
    shot = tmp_path / "report.png"
    args = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--window-size=1000,1400"]
    subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], check=True,
                   capture_output=True, timeout=120)
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    parsed = _Page()
    parsed.feed(dom)  # the DOM as the browser built it
    assert parsed.title == "fedforge report: cmp"
    assert len([t for t, _ in parsed.tags if t == "img"]) == 5
    assert "0.7 ± 1.3" in _cells(parsed)
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (1400, 1000)
    assert (img.min(axis=-1) < 128).mean() > 0.005  # text and figures drawn, not a blank page
