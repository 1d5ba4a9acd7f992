"""The seed scheme (``rollwise.seeds``) is pinned: the values below were computed with the
expressions the loop, the generators and the controllers wrote inline before the scheme had a
module (``seed * 1_000_003 + step``, ``hash((step_seed, salt)) & (2**62 - 1)`` with salts
``rounds`` and ``100 + rounds``, ``np.random.default_rng([seed, step, salt])``). A change here
changes every run's numbers — the suite, ``make demo`` and every benchmark's token counts."""

import numpy as np
import pytest

from rollwise import seeds
from rollwise.control.base import ROUND_CAP, Controller
from rollwise.replay.base import Replay

MASK = 2**62 - 1


@pytest.mark.parametrize(("seed", "step", "expected"), [(0, 0, 0), (0, 7, 7), (3, 5, 3000014),
                                                        (12345, 99, 12345037134)])
def test_step_seed(seed, step, expected):
    assert seeds.step_seed(seed, step) == expected


# step seed -> derived round seeds for salts 1, 2, 8 (refill rounds) and 101, 102 (extend rounds)
ROUND_SEEDS = {
    0: [2661187570846865344, 2593128195744576658, 604127723940645786, 4471060758301260894, 4403001383198972208],
    7: [1642750406402976804, 1361362395857668342, 4197376577924145150, 1275280845637453371, 3171235583312063892],
    3000014: [2985382082895404874, 269650802142627491, 928322235989185316, 183569251922412520,
              2079523989597023041],
    12345037134: [2438176576650538933, 2156788566105230471, 167788094301299599, 4248049764104934483,
                  3966661753559626021],
}


@pytest.mark.parametrize("base", list(ROUND_SEEDS))
def test_round_seeds(base):
    salts = [seeds.refill_round(1), seeds.refill_round(2), seeds.refill_round(8), seeds.extend_round(1),
             seeds.extend_round(2)]
    assert salts == [1, 2, 8, 101, 102]
    assert [seeds.round_seed(base, s) for s in salts] == ROUND_SEEDS[base]
    assert seeds.round_seed(base, seeds.FIRST_ROUND) == base  # the first round samples with the step seed
    assert [seeds.round_seed(base, s) for s in salts] == [hash((base, s)) & MASK for s in salts]


def test_refill_and_extend_salts_never_meet():
    refills = {seeds.refill_round(n) for n in range(1, ROUND_CAP + 1)}
    extends = {seeds.extend_round(n) for n in range(1, ROUND_CAP + 1)}
    assert not refills & extends and seeds.FIRST_ROUND not in refills | extends
    assert all(seeds.is_extend_round(s) for s in extends) and not any(seeds.is_extend_round(s) for s in refills)


def test_request_seeds():
    """generate/: one seed per (round seed, prompt index, sample index), or (round seed, prompt index)."""
    assert seeds.derive(3000014, 0, 0) == 2621990263062488289
    assert seeds.derive(3000014, 2, 5) == 1538439840380701351
    assert seeds.derive(3000014, 4) == 2097546164714949326


def test_controller_and_replay_draw_from_one_scheme():
    assert seeds.rng(0, 3, 0).integers(0, 2**31, 3).tolist() == [1081993679, 1921939326, 2050023942]
    assert seeds.rng(7, 2, 1).integers(0, 2**31, 3).tolist() == [437389971, 1123380372, 635802551]
    controller = Controller(seed=7)
    controller.step = 2
    assert controller.rng(1).integers(0, 2**31, 3).tolist() == [437389971, 1123380372, 635802551]
    assert Replay(seed=7).rng(2, 1).integers(0, 2**31, 3).tolist() == [437389971, 1123380372, 635802551]
    assert np.array_equal(Replay(seed=0).rng(3).random(4), seeds.rng(0, 3).random(4))
