"""``python -m fedforge.bench.compile_cache`` appends one row with the ratio of the second
process's compile time to the first's (the two processes are faked here: they compile)."""

from fedforge.bench import compile_cache


def test_row_appended_with_ratio(monkeypatch, tmp_path):
    runs = [{"compile_s": 40.0, "round_s": 0.5, "fx_graph_hits": 0, "autograd_hits": 0,
             "autograd_bypasses": 0},
            {"compile_s": 4.0, "round_s": 0.5, "fx_graph_hits": 2, "autograd_hits": 1,
             "autograd_bypasses": 0}]
    monkeypatch.setattr(compile_cache, "measure", lambda model, cohort: runs)
    results = tmp_path / "results"
    compile_cache.main(["--model", "logreg", "--cohort", "2", "--results", str(results)])
    text = (results / "RESULTS.md").read_text()
    assert (results / "compile-cache-logreg-2.json").is_file()
    assert "| " + " | ".join(compile_cache.HEADER) + " |" in text
    assert "| 40.0 | 4.00 | 0.10 |" in text
    assert "`python -m fedforge.bench.compile_cache --model logreg --cohort 2`" in text
    assert "2 FX-graph and 1 AOTAutograd cache hits" in text
