import numpy as np
import pytest

from fedforge.sim.delays import ConstantDelay, ShiftedExponential, TraceDelay, build_delay


def test_shifted_exponential_mean_and_shift():
    """E = 1.5 tau e s and min -> 0.5 tau e s (one draw per request, scaled by tau)."""
    law, rng = ShiftedExponential(), np.random.default_rng(123)
    tau, e, s = 27, 0.228, 1.3
    x = np.array([law.sample(rng, 0, s, tau, e) for _ in range(20000)])
    assert x.mean() == pytest.approx(1.5 * tau * e * s, rel=0.02)
    assert law.mean(s, tau, e) == pytest.approx(1.5 * tau * e * s)
    shift = 0.5 * tau * e * s
    assert x.min() >= shift and x.min() == pytest.approx(shift, rel=0.01)
    # the exponential part: its std equals its mean (tau e s)
    assert x.std() == pytest.approx(tau * e * s, rel=0.03)


def test_constant_and_trace():
    assert ConstantDelay().sample(None, 0, 0.7, 10, 0.5) == pytest.approx(3.5)
    tr = TraceDelay({0: [1.0, 2.0], 1: [5.0]}, scale_by_speed=True)
    got = [tr.sample(None, 0, 2.0, 1, 1.0) for _ in range(3)] + [tr.sample(None, 1, 1.0, 1, 1)]
    assert got == [2.0, 4.0, 2.0, 5.0]
    st = tr.state_dict()
    tr2 = TraceDelay({0: [1.0, 2.0], 1: [5.0]}, scale_by_speed=True)
    tr2.load_state_dict(st)
    assert tr2.sample(None, 0, 1.0, 1, 1) == 2.0  # continues the cycle


def test_trace_file_and_errors(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("1.5, 2.5\n3")
    law = build_delay("trace", trace=str(f))
    assert [law.sample(None, 9, 1.0, 1, 1) for _ in range(4)] == [1.5, 2.5, 3.0, 1.5]
    with pytest.raises(ValueError, match="system.delay_trace"):
        build_delay("trace", trace=str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="system.delay"):
        build_delay("weibull")
