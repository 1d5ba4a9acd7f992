"""The ledger's reading (``rollwise.bench.reading``): nothing before every arm has its seeds; then a
claim only for a family-wise verdict, the per-arm-only ones named and not claimed, the range of
effects not told apart from none, the tokens measure stated, and the noise floor's check first."""

import doctest

import pytest

from rollwise.bench import reading as reading_module
from rollwise.bench.arms import BASELINE
from rollwise.bench.harness import NOISE_FLOOR
from rollwise.bench.ledger import summarize, to_markdown
from rollwise.bench.reading import read_table, reading_lines
from rollwise.bench.stats import NO_DIFFERENCE


def row(seeds=5, verdict=NO_DIFFERENCE, difference=0.0, ci=(-0.03, 0.03), p=0.5, p_holm=1.0, ratio_ci=None,
        reached=5):
    return {"seeds": seeds, "verdict": verdict, "difference": difference, "ci95": list(ci), "p": p,
            "p_holm": p_holm, "tokens_ratio_ci95": ratio_ci, "reached": reached, "tokens_ratio_seeds": seeds,
            "lines": []}


def table(**arms):
    return {BASELINE: {"seeds": 5, "verdict": "baseline", "difference": 0.0, "lines": []},
            NOISE_FLOOR: row(), **arms}


def test_no_reading_before_every_arm_has_its_seeds():
    rows = table(**{"control:vade": row(), "control:gdro": row(seeds=4, verdict="better", difference=0.2,
                                                             ci=(0.1, 0.3), p=0.001, p_holm=0.002)})
    got = read_table(rows, look=5)
    assert not got["ready"] and got["short"] == ["control:gdro"] and "claimed" not in got
    text = "\n".join(reading_lines(got))
    assert "not yet" in text and "1 arm has fewer" in text and "gdro" not in text
    assert read_table(rows, look=4)["ready"]  # a look at 4 seeds reads it
    baseline_short = table(**{"control:vade": row()})
    baseline_short[BASELINE]["seeds"] = 3
    assert read_table(baseline_short, look=5)["short"] == [BASELINE]


def test_a_claim_only_when_family_wise():
    rows = table(**{"control:vade": row(verdict="better", difference=0.06, ci=(0.02, 0.10), p=0.004, p_holm=0.04),
                    "control:gdro": row(verdict="better", difference=0.04, ci=(0.001, 0.08), p=0.045, p_holm=0.36),
                    "control:xrpo_alloc": row(ci=(-0.05, 0.04), ratio_ci=[0.3, 0.9]),
                    "objective:dapo": row(verdict="worse", difference=-0.07, ci=(-0.1, -0.04), p=0.001,
                                          p_holm=0.004, ratio_ci=[1.1, 2.0])})
    got = read_table(rows, look=5)
    assert got["ready"] and [c["arm"] for c in got["claimed"]] == ["control:vade", "objective:dapo"]
    assert [c["arm"] for c in got["per_arm_only"]] == ["control:gdro"]
    assert got["faster"] == ["control:xrpo_alloc"] and got["slower"] == ["objective:dapo"]
    text = "\n".join(reading_lines(got))
    assert "`control:vade` beats its baseline family-wise: Δ +6.0 [+2.0, +10.0] points (Holm p 0.040)" in text
    assert "`objective:dapo` loses to its baseline family-wise" in text
    assert "`control:gdro` reads better on its own p (0.045) but not family-wise (Holm p 0.360): not claimed" in text
    assert "No method arm differs" not in text and "4 method arms" in text


def test_fewer_tokens_is_never_read_from_an_arm_with_a_seed_that_never_got_there():
    """An interval below 1× with a seed counted at its lower bound is not "fewer" (that seed could be far
    slower); an interval above 1× is "more" either way (the bound only understates it)."""
    rows = table(**{"control:vade": row(ratio_ci=[0.3, 0.9], reached=4),
                    "control:gdro": row(ratio_ci=[1.2, 2.0], reached=3),
                    "control:xrpo_alloc": row(ratio_ci=[0.3, 0.9])})
    got = read_table(rows, look=5)
    assert got["faster"] == ["control:xrpo_alloc"] and got["slower"] == ["control:gdro"]
    assert got["never_reached"] == {"control:vade": 1, "control:gdro": 2}
    assert "`control:gdro` (2 of its seeds never got there) needed more" in "\n".join(reading_lines(got))


def test_none_differs_says_so_with_the_range_it_cannot_tell_from_none():
    rows = table(**{"control:vade": row(ci=(-0.041, 0.03)), "control:gdro": row(ci=(-0.02, 0.052))})
    got = read_table(rows, look=5)
    assert got["claimed"] == [] and got["bounds"] == pytest.approx([-4.1, 5.2])
    text = "\n".join(reading_lines(got))
    assert "No method arm differs detectably from its baseline family-wise; the arms' intervals span -4.1 to +5.2" in text
    assert "no arm's interval excludes 1×" in text


def test_a_noise_floor_with_a_verdict_puts_the_rule_in_doubt_and_a_refused_arm_is_named():
    rows = table(**{"control:vade": row(), "strategy:april": {"refused": "ConfigError: no", "lines": []}})
    rows[NOISE_FLOOR] = row(verdict="worse", difference=-0.05, ci=(-0.08, -0.02), p=0.01)
    got = read_table(rows, look=5)
    text = "\n".join(reading_lines(got))
    assert got["ready"] and got["failed"] == ["strategy:april"]
    assert "The noise floor reads \"worse\"" in text and "Failed to run (refused): `strategy:april`" in text


def test_the_ledger_prints_the_reading_under_its_table():
    """From summarized runs: the paired verdicts and Holm p the reading reads are the ledger's own."""
    base = "1" * 50 + "0" * 50
    better = "1" * 60 + "0" * 40  # +10 points on every seed: a verdict with p ~ 0 and Holm p ~ 0
    runs = [{"task": "t", "arm": arm, "seed": s, "final_accuracy": c.count("1") / 100, "correct": c,
             "eval_correct": [c], "trace": [[100.0, 0.5 + (arm != BASELINE) * 0.1 + s * 0.01]], "curve": [(0, 0.5)],
             "wall_seconds": 1.0, "steps": 1}
            for s in range(3) for arm, c in ((BASELINE, base), ("control:vade", better))]
    summary = summarize(runs, [BASELINE, "control:vade"])
    ledger = {"command": "c", "tasks": {"t": summary}, "reading": {"t": {"": read_table(summary, look=3)}}}
    md = to_markdown(ledger)
    assert "`control:vade` beats its baseline family-wise: Δ +10.0" in md
    ledger["reading"] = {"t": {"": read_table(summary, look=5)}}
    assert "**Reading:** not yet" in to_markdown(ledger) and "beats" not in to_markdown(ledger)


def test_doctests():
    assert doctest.testmod(reading_module).failed == 0
