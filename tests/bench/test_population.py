"""``fedforge bench population``: its configs load, its numbers and its table are right."""

from __future__ import annotations

import pytest

from fedforge.bench import population as pop
from fedforge.bench.results import record_results, run_info
from fedforge.experiment.config import load_config


def test_every_configuration_is_a_valid_population_run(tmp_path):
    for alg in pop.PopulationBench().algorithms:
        for store in pop.PopulationBench().stores:
            path = tmp_path / f"{alg}-{store}.toml"
            path.write_text(pop.run_config(1_000_000, alg, store, pop.PopulationBench()))
            cfg = load_config(path)
            assert cfg.data.dataset == "synthetic_population"
            assert cfg.data.options["num_clients"] == 1_000_000
            assert cfg.server.clients_per_round == 1000 and cfg.eval.clients == 1000
            assert cfg.algorithm.name == alg and cfg.engine.client_store == store


def test_the_model_has_54410_parameters_and_state_bytes_follow_the_algorithm():
    params = 60 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert params == 54_410
    assert pop.state_bytes("scaffold", 1000) == 1000 * params * 4  # c_i
    assert pop.state_bytes("fadamgc", 10) == 10 * (params * 4 * 2 + 4)  # y_i, v_i, a count
    assert pop.memory_fits(0) and not pop.memory_fits(1 << 62)


def test_quick_and_overrides():
    assert pop.quick_or_full(True, None, None, None) == pop.QUICK
    full = pop.quick_or_full(False, "1e3,2000", 500, 4)
    assert full.populations == (1000, 2000) and full.cohort == 500 and full.rounds == 4
    with pytest.raises(ValueError, match="--cohort: 5000 is more than"):
        pop.quick_or_full(False, "1000", 5000, None)
    with pytest.raises(ValueError, match="--rounds"):
        pop.quick_or_full(True, None, None, 2)


def test_the_table_and_the_figure(tmp_path):
    rows = [[100, "scaffold", "disk", 400.0, 20.5, 1.2, 0.1, ""],
            [1000, "scaffold", "disk", 420.0, 21.0, 1.1, 0.1, ""],
            [1000, "scaffold", "memory", None, None, None, None, "state 9 GiB: does not fit"]]
    text = record_results(tmp_path / "results", "population", "quick", pop.title(pop.QUICK),
                          pop.HEADER, rows, run_info(command="fedforge bench population --quick"))
    assert "load average" in text and "torch" in text
    assert "command: `fedforge bench population --quick`" in text
    assert "| 1000 | scaffold | memory |  |  |  |  | state 9 GiB: does not fit |" in text
    assert text.count("\n|") == 5  # header, rule, three rows
    assert pop.plot_population(rows, tmp_path).stat().st_size > 1000


@pytest.mark.slow
def test_one_configuration_runs_in_its_own_process(tmp_path):
    bench = pop.PopulationBench(populations=(30,), cohort=3, rounds=3, local_steps=1,
                                algorithms=("scaffold",), stores=("memory",))
    rows = pop.run_population(bench, tmp_path)
    assert len(rows) == 1 and rows[0][7] == "", rows
    n, alg, store, rss, disk, per_round, ckpt, _ = rows[0]
    assert (n, alg, store) == (30, "scaffold", "memory")
    assert rss > 50 and disk > 0 and per_round > 0 and ckpt > 0
    assert (tmp_path / "runs" / "30-scaffold-memory" / "partition.npz").is_file()
