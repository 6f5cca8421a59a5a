"""Client samplers on tiny pools with known losses, sizes and durations, picks computed by hand.

Each case is built so that a wrong rule picks differently: the lowest loss instead of the
highest, no speed penalty, no pacer, no exploration decay.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedforge.sim.oort import Oort, normalise, speed_penalty, weighted_draw
from fedforge.sim.samplers import build_sampler, sampler_names
from fedforge.sim.selection import Feedback, Pool, PowerOfChoice, draw_by_size, selection_rng

OORT_CODE_DEFAULTS = dict(exploration_factor=0.9, exploration_decay=0.95, exploration_min=0.2,
                          round_threshold=10.0, round_penalty=2.0, pacer_step=20,
                          pacer_delta=5.0, cut_off_util=0.7, sample_window=5.0, clip_bound=0.98)


def _pool(sizes, losses=None, durations=None, samples=None, asked=None) -> Pool:
    sizes = np.asarray(sizes, dtype=np.int64)

    def loss_of(ids, batch, rng):
        if asked is not None:
            asked.append((sorted(ids.tolist()), batch))
            assert isinstance(rng, np.random.Generator)
        return np.asarray(losses, dtype=np.float64)[ids]

    return Pool(sizes, np.asarray(sizes if samples is None else samples, dtype=np.float64),
                np.ones(len(sizes)) if durations is None else np.asarray(durations, float),
                loss_of)


def _feedback(ids, train_loss=None, rms=None, samples=None, durations=None) -> Feedback:
    k = len(ids)
    return Feedback(np.asarray(ids), np.asarray(train_loss if train_loss is not None else [0] * k,
                                                dtype=float),
                    np.asarray(rms if rms is not None else [0] * k, dtype=float),
                    np.asarray(samples if samples is not None else [1] * k, dtype=float),
                    np.asarray(durations if durations is not None else [1] * k, dtype=float))


# --- Power-of-Choice ---------------------------------------------------------------------
def test_pow_d_trains_the_m_highest_loss_candidates():
    """d = every client with data: the candidates are clients 0, 1, 2, 4, 5 (client 3 has no
    samples); by loss 0.9 (c4) > 0.7 (c1) > 0.5 (c5) > 0.3 (c0) > 0.1 (c2), m = 2 -> {1, 4}.
    The lowest-loss rule would pick {0, 2}."""
    asked: list = []
    pool = _pool([10, 20, 30, 0, 40, 50], losses=[0.3, 0.7, 0.1, 5.0, 0.9, 0.5], asked=asked)
    poc = PowerOfChoice(6, 2, d=6, variant="pow-d", batch=None, batch_size=4)
    assert poc.select(1, 2, pool, selection_rng(0, 1)).tolist() == [1, 4]
    assert asked == [([0, 1, 2, 4, 5], None)]  # the whole data of each candidate


def test_candidates_are_drawn_in_proportion_to_data_size():
    """d = 1 of sizes (1, 0, 99): client 2 is the candidate with probability 0.99, client 1
    never; over 400 seeded draws client 0 comes up a handful of times."""
    sizes = np.array([1, 0, 99])
    picks = [int(draw_by_size(sizes, 1, selection_rng(s, 1))[0]) for s in range(400)]
    assert 1 not in picks
    assert 0 < picks.count(0) <= 12 and picks.count(2) >= 388


def test_cpow_d_ranks_by_a_mini_batch_of_batch_samples():
    asked: list = []
    pool = _pool([10, 20, 30], losses=[0.2, 0.1, 0.3], asked=asked)
    poc = PowerOfChoice(3, 1, d=3, variant="cpow-d", batch=None, batch_size=7)
    assert poc.select(1, 1, pool, selection_rng(0, 1)).tolist() == [2]
    assert asked == [([0, 1, 2], 7)]  # client.batch_size when batch is not given


def test_rpow_d_ranks_by_the_last_reported_training_loss_unseen_first():
    """Round 1: nothing reported, all +inf, ties to the lower ids -> {0, 1}. They report 0.4
    and 0.2; round 2 tries the unseen 2 and 3; round 3, with 2 and 3 at 0.1 and 0.3, ranks
    0.4 (c0) > 0.3 (c3)."""
    pool = _pool([5, 5, 5, 5], losses=[9, 9, 9, 9])
    poc = PowerOfChoice(4, 2, d=4, variant="rpow-d", batch=None, batch_size=1)
    assert poc.select(1, 2, pool, selection_rng(0, 1)).tolist() == [0, 1]
    poc.observe(1, _feedback([0, 1], train_loss=[0.4, 0.2]))
    assert poc.select(2, 2, pool, selection_rng(0, 2)).tolist() == [2, 3]
    poc.observe(2, _feedback([2, 3], train_loss=[0.1, 0.3]))
    assert poc.select(3, 2, pool, selection_rng(0, 3)).tolist() == [0, 3]


@pytest.mark.parametrize(("name", "options", "message"), [
    ("nope", {}, r"^server\.sampler: unknown sampler 'nope'; expected one of \['uniform', "),
    ("oort", {"alpha": 2}, r"^server\.sampler_options: unknown option 'alpha' for oort"),
    ("uniform", {"d": 4}, r"^server\.sampler_options: the uniform sampler takes no options"),
    ("power_of_choice", {"d": 2}, r"^server\.sampler_options\.d: expected an integer >= "
                                  r"server\.clients_per_round \(3\), got 2$"),
    ("power_of_choice", {"variant": "pow"}, r"^server\.sampler_options\.variant: expected"),
    ("oort", {"exploration_min": 1.5}, r"^server\.sampler_options\.exploration_min: expected"),
    ("oort", {"pacer_step": 0}, r"^server\.sampler_options\.pacer_step: expected an integer"),
])
def test_bad_sampler_settings_are_refused_in_one_line(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_sampler(name, options, num_clients=8, clients_per_round=3, batch_size=4)


def test_the_samplers_are_listed_with_uniform_first():
    assert sampler_names() == ("uniform", "power_of_choice", "oort")
    poc = build_sampler("power_of_choice", {}, num_clients=8, clients_per_round=3, batch_size=4)
    assert poc.d == 6  # d = 2m by default


# --- Oort --------------------------------------------------------------------------------
def _oort(n: int, **options) -> Oort:
    return Oort(n, **{**OORT_CODE_DEFAULTS, **options})


def _explored(oort: Oort, rewards, durations, last_round=1) -> None:
    n = len(rewards)
    oort.reward[:], oort.duration[:] = rewards, durations
    oort.last_round[:], oort.count[:] = last_round, 1
    oort.registered = 1.0
    assert len(oort.reward) == n


def test_oort_scores_by_hand():
    """Rewards (10, 8, 6, 4), last seen in rounds (1, 2, 2, 1), scored in round 3: clip = the
    98 % quantile = 10, low = 4 x 0.999 = 3.996, range = 6.004, the staleness bonus
    sqrt(0.1 ln 3 / L_i) with L_i the round last seen (not the rounds since). T = 3 s (the
    50th percentile of durations 1, 10, 2, 3); client 1 takes 10 s, so its score is
    multiplied by (3 / 10)^2 = 0.09 and falls from second to last."""
    oort = _oort(4)
    _explored(oort, [10.0, 8.0, 6.0, 4.0], [1.0, 10.0, 2.0, 3.0], last_round=[1, 2, 2, 1])
    oort.preferred = 3.0
    s1, s2 = math.sqrt(0.1 * math.log(3)), math.sqrt(0.1 * math.log(3) / 2)
    expected = [1.0 + s1, (4.004 / 6.004 + s2) * 0.09, 2.004 / 6.004 + s2, 0.004 / 6.004 + s1]
    np.testing.assert_allclose(oort.scores(3, np.arange(4)), expected, rtol=1e-12)
    assert normalise(np.array([10.0, 8.0, 6.0, 4.0]), 0.98) == pytest.approx((10.0, 3.996, 6.004))
    np.testing.assert_allclose(speed_penalty(np.array([1.0, 10.0]), 3.0, 2.0), [1.0, 0.09])


def test_oort_exploits_fast_high_utility_clients_and_never_the_slow_one():
    """The pool above with ε at 0 (m = 2 exploited): the cut-off is 0.7 x the third score
    (client 3's, 0.264), so client 1 (0.084 after its speed penalty) is never drawn, and
    client 0 (1.26) is in almost every cohort. Without the penalty client 1 (0.93) would be
    the second best and drawn in most cohorts."""
    picks = []
    for seed in range(60):
        oort = _oort(4, exploration_factor=0.0, exploration_min=0.0, round_threshold=50.0)
        _explored(oort, [10.0, 8.0, 6.0, 4.0], [1.0, 10.0, 2.0, 3.0])
        picks.append(oort.select(2, 2, _pool([9, 9, 9, 9]), selection_rng(seed, 2)).tolist())
    assert oort.preferred == 3.0
    assert not any(1 in p for p in picks)
    assert sum(0 in p for p in picks) >= 40


def test_oort_explores_by_size_times_speed_penalty():
    """Nothing explored, ε = 1 so the whole cohort is exploration, sample window 1: the top
    unexplored client by reward x penalty is drawn. Rewards (5, 50, 20), durations (1, 100,
    1): T = 1 s (the 50th percentile), client 1's 50 becomes 50 x (1/100)^2 = 0.005, so
    client 2 is picked; without the penalty it would be client 1."""
    oort = _oort(3, exploration_factor=1.0, exploration_decay=1.0, exploration_min=1.0,
                 round_threshold=50.0, sample_window=1.0)
    pool = _pool([5, 50, 20], durations=[1.0, 100.0, 1.0])
    assert oort.select(1, 1, pool, selection_rng(0, 1)).tolist() == [2]
    assert oort.reward.tolist() == [5.0, 50.0, 20.0]  # registered: reward = |B_i|


def test_oort_reward_is_samples_times_rms_loss_and_exploration_decays():
    """After round 1 a participant's reward is |B_i| sqrt(mean loss²) = 4 x 0.5; ε goes
    0.9 -> 0.855 -> 0.81225 (x 0.95 a round), and to 0 once nobody is left to explore."""
    oort = _oort(3)
    pool = _pool([4, 4, 4])
    assert len(oort.select(1, 2, pool, selection_rng(0, 1))) == 2
    assert oort.exploration == pytest.approx(0.855)
    oort.observe(1, _feedback([0, 2], rms=[0.5, 0.25], samples=[4, 4], durations=[3.0, 1.0]))
    assert oort.reward.tolist() == [2.0, 4.0, 1.0]
    assert oort.duration.tolist()[::2] == [3.0, 1.0] and oort.last_round.tolist() == [1, 0, 1]
    oort.select(2, 2, pool, selection_rng(0, 2))
    assert oort.exploration == pytest.approx(0.81225)
    oort.observe(2, _feedback([1], rms=[1.0], samples=[4]))
    oort.select(3, 2, pool, selection_rng(0, 3))  # every client explored
    assert oort.exploration == 0.0 and oort.exploration_min == 0.0


def test_the_pacer_relaxes_the_preferred_duration_when_utility_is_flat():
    """pacer_step 2: the exploited clients' mean utility is recorded each round; at round 4
    the rounds 3-4 sum (2 + 2) equals the rounds 1-2 sum (2 + 2): flat, so the percentile
    goes 10 -> 15. A jump (rounds 5-6 summing 40 >= 5 x 4) at round 6 tightens it back."""
    oort = _oort(2, pacer_step=2, pacer_delta=5.0)
    oort.exploit_clients = np.array([0])
    utilities = {1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0, 5: 20.0, 6: 20.0}
    thresholds = []
    for t in range(1, 7):
        oort.reward[0], oort.successful[0] = utilities[t], 1
        oort.pacer(t)
        thresholds.append(oort.round_threshold)
    assert thresholds == [10.0, 10.0, 10.0, 15.0, 15.0, 10.0]
    np.testing.assert_allclose(oort.exploit_history, [2 / 1.0001] * 4 + [20 / 1.0001] * 2)


def test_oort_state_round_trip_continues_exactly():
    """Two samplers, one rebuilt from the other's state after round 3, select the same cohorts
    and end in the same state."""
    pool = _pool([3, 8, 5, 9, 2, 7], durations=[1, 4, 2, 8, 1, 3])

    def play(oort, rounds):
        out = []
        for t in rounds:
            ids = oort.select(t, 2, pool, selection_rng(1, t))
            oort.observe(t, _feedback(ids, rms=0.1 * ids + 0.05 * t, samples=[3, 3],
                                      durations=1.0 + ids))
            out.append(ids.tolist())
        return out

    a = _oort(6, pacer_step=2)
    play(a, range(1, 4))
    b = _oort(6, pacer_step=2)
    b.load_state_dict(a.state_dict())
    assert play(a, range(4, 9)) == play(b, range(4, 9))
    for key, value in a.state_dict().items():
        assert value.equal(b.state_dict()[key]), key
    with pytest.raises(ValueError, match=r"^checkpoint: sampler 'oort' state has no 'reward'"):
        _oort(6).load_state_dict({})


# --- Oort, rule by rule ------------------------------------------------------------------
def test_normalise_clips_at_the_quantile_and_keeps_a_floor_on_the_range():
    """Four rewards with clip_bound 0.5: the clip is the sorted list's entry int(4 x 0.5) =
    2; clip_bound 1 takes the last; one reward: its range is the 1e-4 floor; none: 0, 0, 1."""
    assert normalise(np.array([4.0, 1.0, 3.0, 2.0]), 0.5) == pytest.approx((3.0, 0.999, 3.001))
    assert normalise(np.array([4.0, 1.0, 3.0, 2.0]), 1.0)[0] == 4.0
    assert normalise(np.array([2.0]), 0.98) == pytest.approx((2.0, 1.998, 0.002))
    assert normalise(np.array([5e-5]), 0.98)[2] == 1e-4
    assert normalise(np.zeros(0), 0.98) == (0.0, 0.0, 1.0)


def test_speed_penalty_applies_above_t_only_with_its_floor():
    np.testing.assert_allclose(
        speed_penalty(np.array([0.4, 0.5, 0.8, 2.0]), 0.5, 2.0), [1.0, 1.0, 0.390625, 0.0625])
    np.testing.assert_allclose(speed_penalty(np.array([3, 6]), 2.0, 1.0), [2 / 3, 1 / 3])
    assert speed_penalty(np.array([1e-6]), 0.0, 1.0)[0] == 0.0  # T = 0: d floored at 1e-4


def test_weighted_draw_is_in_proportion_and_without_replacement():
    ids = np.array([10, 11, 12])
    draws = [weighted_draw(ids, np.array([1.0, 2.0, 7.0]), 1, selection_rng(s, 1))[0]
             for s in range(300)]
    assert 0.6 < draws.count(12) / 300 < 0.8 and 0.02 < draws.count(10) / 300 < 0.2
    pair = weighted_draw(ids, np.array([1.0, 1.0, 1.0]), 2, selection_rng(0, 1))
    assert len(set(pair.tolist())) == 2
    assert weighted_draw(ids, np.array([0.0, 3.0, 0.0]), 2, selection_rng(0, 1)).tolist() == [
        11, 10]  # one weighted id, then the others in order
    assert weighted_draw(ids, np.array([1.0, 3.0, 1.0]), 0, selection_rng(0, 1)).tolist() == []


@pytest.mark.parametrize(("start", "round_", "history", "expected"), [
    (50.0, 6, [100, 100, 5, 5, 11], 55.0),   # |11 - 10| = 0.1 x 10: flat, relaxed
    (50.0, 6, [100, 100, 5, 5, 15], 50.0),   # 5: neither flat nor a jump
    (50.0, 6, [100, 100, 5, 5, 45], 50.0),   # 35 < 5 x 10
    (50.0, 6, [100, 100, 5, 5, 60], 45.0),   # 50 = 5 x 10: a jump, tightened
    (98.0, 6, [100, 100, 5, 5, 11], 100.0),  # relaxed up to 100 at most
    (7.0, 6, [100, 100, 5, 5, 60], 5.0),     # tightened down to pacer_delta at least
    (50.0, 5, [100, 100, 5, 5], 50.0),       # not a multiple of pacer_step
    (50.0, 3, [5, 5], 50.0),                 # fewer than 2 x pacer_step rounds
])
def test_the_pacer_compares_the_last_two_windows(start, round_, history, expected):
    """pacer_step 2: round t's call appends last round's exploited utility (here 0: nobody
    exploited) and compares the sums of the last two windows of 2."""
    oort = _oort(3, pacer_step=2, pacer_delta=5.0, round_threshold=start)
    oort.exploit_history = np.array(history, dtype=float)
    oort.pacer(round_)
    assert oort.round_threshold == expected
    assert oort.exploit_history[-1] == 0.0 and len(oort.exploit_history) == len(history) + 1


def test_the_pacer_counts_only_clients_that_reported_since_its_last_call():
    """Clients 0 and 1 were exploited; only client 0 reported (reward 6): the utility is
    6 / (1 + 1e-4). At the next call nobody has reported again: 0."""
    oort = _oort(3)
    oort.reward[:] = [6.0, 9.0, 1.0]
    oort.exploit_clients = np.array([0, 1])
    oort.observe(1, _feedback([0], rms=[1.5], samples=[4]))
    oort.pacer(2)
    oort.pacer(3)
    np.testing.assert_allclose(oort.exploit_history, [6.0 / 1.0001, 0.0])
    assert oort.explore_history.tolist() == [0.0, 0.0]


def test_only_positive_rewards_normalise_and_only_explored_clients_score():
    """Explored clients 0-2 with rewards (0, 0.5, 2), client 3 unexplored with 8: the range
    comes from 0.5, 2 and 8 (low 0.4995), client 0 scores below zero, client 3 is NaN."""
    oort = _oort(4)
    oort.reward[:] = [0.0, 0.5, 2.0, 8.0]
    oort.count[:], oort.last_round[:] = [1, 1, 1, 0], [1, 1, 1, 0]
    s = math.sqrt(0.1 * math.log(2))
    clip, low, span = normalise(np.array([0.5, 2.0, 8.0]), 0.98)
    score = oort.scores(2, np.arange(4))
    np.testing.assert_allclose(score[:3], [(0.0 - low) / span + s, (0.5 - low) / span + s,
                                           (2.0 - low) / span + s])
    assert (low, clip) == pytest.approx((0.4995, 8.0)) and math.isnan(score[3])
    oort.reward[:] = [0.0, 0.0, 0.0, 0.0]  # no positive reward: (r - 0) / 1
    np.testing.assert_allclose(oort.scores(2, np.arange(4))[:3], [s, s, s])


def _explored_pool(n, seed_rewards=None):
    oort = _oort(n, exploration_factor=0.0, exploration_min=0.0)
    _explored(oort, seed_rewards or [8.0, 1.0, 6.0, 4.0][:n], [1.0] * n)
    return oort


def test_the_cut_off_keeps_the_successor_of_the_kth_best():
    """Scores 1.26, 0.08, 0.6, 0.26 (the pool of test_oort_scores_by_hand at T = 3 s): m = 2,
    the cut is 0.7 x the third best (0.26); client 3 is drawn now and then, client 1 never.
    With cut_off_util 1 the third best is still in; with m = 4 every client is exploited."""
    def cohorts(m, **options):
        out = []
        for seed in range(80):
            oort = _oort(4, exploration_factor=0.0, exploration_min=0.0, round_threshold=50.0,
                         **options)
            _explored(oort, [10.0, 8.0, 6.0, 4.0], [1.0, 10.0, 2.0, 3.0])
            out.append(oort.select(2, m, _pool([9] * 4), selection_rng(seed, 2)).tolist())
            assert len(oort.exploit_clients) == m and len(oort.explore_clients) == 0
        return out

    two = cohorts(2)
    assert any(3 in c for c in two) and not any(1 in c for c in two)
    assert any(3 in c for c in cohorts(2, cut_off_util=1.0))
    assert cohorts(4) == [[0, 1, 2, 3]] * 80


def test_exploration_fills_the_rest_of_the_cohort_and_no_more():
    """Clients 0-1 explored, 2-6 not; m = 4 with ε = 0.5: int(4 x 0.5) = 2 exploited, 2
    explored from the top sample_window x 2 = 4 unexplored by reward (client 6, the
    smallest, never), drawn in proportion, so not always the same pair."""
    picks, explored = [], []
    for seed in range(60):
        oort = _oort(7, exploration_factor=0.5, exploration_decay=1.0, exploration_min=0.5,
                     sample_window=2.0)
        oort.registered = 1.0
        oort.reward[:] = [5.0, 4.0, 9.0, 8.0, 7.0, 6.0, 1.0]
        oort.duration[:] = 1.0
        oort.count[:2], oort.last_round[:2] = 1, 1
        cohort = oort.select(2, 4, _pool([9] * 7), selection_rng(seed, 2))
        assert len(cohort) == 4 and len(set(cohort.tolist())) == 4
        assert oort.exploit_clients.tolist() in ([0, 1], [1, 0])
        explored.append(sorted(oort.explore_clients.tolist()))
        picks.append(cohort.tolist())
    assert not any(6 in c for c in picks)
    assert len({tuple(e) for e in explored}) > 2


def test_a_cohort_without_room_to_explore_explores_nobody():
    """ε = 0 and m = 2 of 2 explored clients: both are exploited, the unexplored 2 and 3 wait."""
    oort = _oort(4, exploration_factor=0.0, exploration_min=0.0)
    oort.registered = 1.0
    oort.reward[:], oort.duration[:] = [5.0, 4.0, 9.0, 8.0], 1.0
    oort.count[:2], oort.last_round[:2] = 1, 1
    assert oort.select(2, 2, _pool([9] * 4), selection_rng(0, 2)).tolist() == [0, 1]
    assert oort.explore_clients.tolist() == []


def test_a_cohort_short_of_candidates_is_filled_uniformly_without_repeats():
    """Every client explored, m = 2 with ε = 0.5: one exploited, none left to explore, one
    filled in at random; over seeds the filled client varies."""
    cohorts = []
    for seed in range(40):
        oort = _oort(4, exploration_factor=0.5, exploration_decay=1.0, exploration_min=0.5)
        _explored(oort, [8.0, 1.0, 6.0, 4.0], [1.0] * 4)
        cohort = oort.select(2, 2, _pool([9] * 4), selection_rng(seed, 2))
        assert len(cohort) == 2 and len(set(cohort.tolist())) == 2
        assert len(oort.exploit_clients) == 1 and oort.exploration == 0.0
        cohorts.append(tuple(cohort.tolist()))
    assert len(set(cohorts)) > 2


def test_t_is_the_percentile_of_every_duration_and_infinite_at_100():
    oort = _oort(5, round_threshold=60.0)
    pool = _pool([9] * 5, durations=[5.0, 1.0, 4.0, 2.0, 3.0])
    oort.select(1, 2, pool, selection_rng(0, 1))
    assert oort.preferred == 4.0  # sorted (1, 2, 3, 4, 5)[int(5 x 0.6)]
    assert oort.metrics()["oort_preferred_duration_s"] == 4.0
    everyone = _oort(5, round_threshold=100.0)
    everyone.select(1, 2, pool, selection_rng(0, 1))
    assert everyone.preferred == math.inf and "oort_preferred_duration_s" not in everyone.metrics()


def test_observe_counts_every_participation_and_the_state_keeps_its_types():
    oort = _oort(3)
    fresh = oort.state_dict()
    assert fresh["exploit_clients"].numel() == 0 and fresh["exploit_history"].numel() == 0
    assert float(fresh["registered"]) == 0.0 and "oort_preferred_duration_s" not in oort.metrics()
    oort.select(1, 2, _pool([4, 4, 4]), selection_rng(0, 1))
    oort.observe(1, _feedback([0, 1], rms=[1.0, 1.0], samples=[4, 4]))
    oort.observe(2, _feedback([0], rms=[1.0], samples=[4]))
    assert oort.count.tolist() == [2, 1, 0] and oort.last_round.tolist() == [2, 1, 0]
    state = oort.state_dict()
    assert state["count"].dtype == state["last_round"].dtype == torch.int64
    assert state["reward"].dtype == state["exploration"].dtype == torch.float64
    assert float(state["registered"]) == 1.0 and state["successful"].tolist() == [True, True,
                                                                                  False]
    assert oort.metrics() == {"oort_exploration": pytest.approx(0.855),
                              "oort_round_threshold": 10.0, "oort_explored_clients": 2.0,
                              "oort_preferred_duration_s": 1.0}
    copy = _oort(3)
    copy.load_state_dict(state)
    assert copy.exploration == oort.exploration and isinstance(copy.registered, float)


@pytest.mark.parametrize(("key", "value", "ok"), [
    ("round_threshold", 0.0, True), ("round_threshold", -1.0, False),
    ("sample_window", 0.5, True), ("pacer_step", 1, True), ("pacer_step", 2.0, False),
    ("clip_bound", 1.0, True), ("cut_off_util", -0.1, False),
])
def test_oort_option_bounds(key, value, ok):
    if ok:
        assert _oort(3, **{key: value}).opt[key] == value
    else:
        with pytest.raises(ValueError, match=rf"^server\.sampler_options\.{key}: expected "):
            _oort(3, **{key: value})


def test_candidates_are_distinct_and_d_may_equal_m():
    """d = 3 of sizes (1, 1, 1, 100): drawn without replacement, always 3 distinct clients."""
    sizes = np.array([1, 1, 1, 100])
    assert all(len(set(draw_by_size(sizes, 3, selection_rng(s, 1)).tolist())) == 3
               for s in range(50))
    assert PowerOfChoice(4, 3, d=3, variant="pow-d", batch=None, batch_size=2).d == 3
    assert PowerOfChoice(4, 3, d=3, variant="cpow-d", batch=1, batch_size=2).batch == 1
    for bad in (0, "2"):
        with pytest.raises(ValueError, match=rf"^server\.sampler_options\.batch: expected an "
                                             rf"integer >= 1, got {bad!r}$"):
            PowerOfChoice(4, 3, d=3, variant="cpow-d", batch=bad, batch_size=2)


def test_power_of_choice_state_round_trip():
    pool = _pool([5, 5, 5, 5], losses=[9, 9, 9, 9])
    a = PowerOfChoice(4, 2, d=4, variant="rpow-d", batch=None, batch_size=1)
    a.observe(1, _feedback([0, 1], train_loss=[0.4, 0.2]))
    b = PowerOfChoice(4, 2, d=4, variant="rpow-d", batch=None, batch_size=1)
    b.load_state_dict(a.state_dict())
    assert b.last_loss.tolist() == [0.4, 0.2, math.inf, math.inf]
    assert b.select(2, 2, pool, selection_rng(0, 2)).tolist() == [2, 3]
    assert list(a.state_dict()) == ["last_loss"] and b.metrics() == {}
    with pytest.raises(ValueError, match=r"^checkpoint: sampler 'power_of_choice' state has no "
                                         r"'last_loss' \(written by another sampler\?\); "
                                         r"choose another --out or pass --overwrite$"):
        b.load_state_dict({})


def test_full_exploration_exploits_nobody_and_weightless_ids_come_once():
    """ε = 1 with explored clients: int(m x 0) = 0 are exploited, the cohort is explored. A
    draw of 3 from weights (0.5, 0, 0) takes the weighted id, then the others, no repeats."""
    oort = _oort(4, exploration_factor=1.0, exploration_decay=1.0, exploration_min=1.0)
    oort.registered = 1.0
    oort.reward[:], oort.duration[:] = [5.0, 4.0, 9.0, 8.0], 1.0
    oort.count[:2], oort.last_round[:2] = 1, 1
    assert oort.select(2, 2, _pool([9] * 4), selection_rng(0, 2)).tolist() == [2, 3]
    assert oort.exploit_clients.tolist() == []
    ids = np.array([7, 8, 9])
    assert weighted_draw(ids, np.array([0.5, 0.0, 0.0]), 3, selection_rng(0, 1)).tolist() == [
        7, 8, 9]
