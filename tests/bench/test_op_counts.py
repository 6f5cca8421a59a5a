"""The benchmark's per-step op counts: counted (never timed), the same on every rerun, and
fedforge's loop within a bound of a plain module's Python calls per step."""

import pytest

from fedforge.bench.op_counts import op_count_note, op_counts


def test_the_loops_python_calls_per_step_stay_within_a_bound_of_a_plain_modules():
    (ff_aten, ff_python), (plain_aten, plain_python) = op_counts().values()
    assert plain_aten > 0 and plain_python > 0 and ff_aten > plain_aten
    # 3.9x before the in-place update and the pooling layers (a mode around every op),
    # 2.8x after, on pfl_simple_cnn with its two keyed dropout layers
    assert ff_python < 3.2 * plain_python


@pytest.mark.slow
def test_counts_are_the_same_on_rerun_and_the_note_names_both_rows():
    assert op_counts("pfl_simple_cnn", "bf16") == op_counts("pfl_simple_cnn", "bf16")
    note = op_count_note("bf16")
    assert "bf16" in note and "fedforge's loop" in note and "plain module" in note
