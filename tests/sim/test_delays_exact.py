"""Exact checks of the delay laws (src/fedforge/sim/delays.py): each draw against the same
generator by hand, the trace cursor per client and shared, files, state and errors
(docs/testing.md).
"""

import numpy as np
import pytest

from fedforge.sim.delays import (
    ConstantDelay,
    DelayLaw,
    ShiftedExponential,
    TraceDelay,
    build_delay,
)


def test_base_law():
    law = DelayLaw()
    assert law.name == "base" and law.state_dict() == {}
    assert law.load_state_dict({"x": 1}) is None
    with pytest.raises(NotImplementedError):
        law.sample(None, 0, 1.0, 1, 1.0)


def test_shifted_exponential_draw_by_hand():
    law = ShiftedExponential()
    assert law.name == "shifted_exp" and law.shift == 0.5
    got = law.sample(np.random.default_rng(5), 3, 2.0, 4, 0.25)
    e = np.random.default_rng(5).exponential(0.5)  # mean e·s = 0.25 · 2
    assert got == pytest.approx(4 * (e + 0.5 * 0.5), rel=1e-12)
    assert isinstance(got, float)
    law2 = ShiftedExponential(0.0)  # no shift is allowed
    assert law2.sample(np.random.default_rng(5), 3, 2.0, 4, 0.25) == pytest.approx(4 * e)
    assert ShiftedExponential(2.0).mean(2.0, 4, 0.25) == pytest.approx(3.0 * 4 * 0.5)
    with pytest.raises(ValueError, match=r"^system\.delay_shift: expected >= 0, got -0\.1$"):
        ShiftedExponential(-0.1)


def test_constant():
    law = ConstantDelay()
    assert law.name == "constant"
    assert law.sample(None, 0, 0.5, 6, 2.0) == 6.0 and isinstance(law.sample(None, 0, 1, 1, 1),
                                                                  float)


def test_trace_shared_and_per_client_cursors():
    shared = TraceDelay([1, 2, 3])
    assert shared.name == "trace" and shared.per_client is None and shared.shared == [1, 2, 3]
    assert not shared.scale_by_speed
    got = [shared.sample(None, c, 10.0, 1, 1.0) for c in (0, 1, 0, 5)]
    assert got == [1.0, 2.0, 3.0, 1.0]  # one cursor for every client, speed ignored
    assert shared.state_dict() == {"cursor": {"-1": 4}}
    per = TraceDelay({"0": [1.0, 2.0], 1: [5.0, 6.0, 7.0]}, scale_by_speed=True)
    assert per.per_client == {0: [1.0, 2.0], 1: [5.0, 6.0, 7.0]}
    got = [per.sample(None, c, 2.0, 1, 1.0) for c in (0, 1, 1, 0, 0)]
    assert got == [2.0, 10.0, 12.0, 4.0, 2.0]
    assert per.state_dict() == {"cursor": {"0": 3, "1": 2}}
    with pytest.raises(ValueError, match=r"^system\.delay_trace: no durations for client 2$"):
        per.sample(None, 2, 1.0, 1, 1.0)
    fresh = TraceDelay({0: [1.0, 2.0], 1: [5.0, 6.0, 7.0]})
    fresh.load_state_dict({"cursor": {"0": 3, "1": 2}})
    assert fresh.cursor == {0: 3, 1: 2}
    assert fresh.sample(None, 1, 1.0, 1, 1.0) == 7.0
    fresh.load_state_dict({})
    assert fresh.cursor == {}


@pytest.mark.parametrize("bad", [[], {0: []}, {}, [1.0, -0.5], {0: [1.0], 1: [-1.0]}])
def test_trace_errors(bad):
    with pytest.raises(ValueError, match=r"^system\.delay_trace: expected non-empty lists of "
                                         r"durations >= 0$"):
        TraceDelay(bad)


def test_trace_zero_durations_are_allowed():
    assert TraceDelay([0.0]).sample(None, 0, 1.0, 1, 1.0) == 0.0


def test_trace_files(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("1.5, 2\n3")
    law = TraceDelay.from_file(text, scale_by_speed=True)
    assert law.shared == [1.5, 2.0, 3.0] and law.scale_by_speed
    js = tmp_path / "t.json"
    js.write_text('{"0": [4, 5]}')
    law = TraceDelay.from_file(str(js))
    assert law.per_client == {0: [4.0, 5.0]} and not law.scale_by_speed
    missing = tmp_path / "none.txt"
    with pytest.raises(ValueError, match=rf"^system\.delay_trace: file '{missing}' not found$"):
        TraceDelay.from_file(missing)


def test_build_delay(tmp_path):
    law = build_delay("shifted_exp")
    assert isinstance(law, ShiftedExponential) and law.shift == 0.5
    assert build_delay("shifted_exp", shift=0.25).shift == 0.25
    assert isinstance(build_delay("constant"), ConstantDelay)
    path = tmp_path / "t.txt"
    path.write_text("2 4")
    law = build_delay("trace", trace=str(path), scale_by_speed=True)
    assert law.shared == [2.0, 4.0] and law.scale_by_speed
    assert not build_delay("trace", trace=str(path)).scale_by_speed
    with pytest.raises(ValueError, match=r"^system\.delay_trace: the trace law needs a file$"):
        build_delay("trace")
    with pytest.raises(ValueError, match=r"^system\.delay: unknown law 'gamma'; expected one "
                                         r"of \['constant', 'shifted_exp', 'trace'\]$"):
        build_delay("gamma")
