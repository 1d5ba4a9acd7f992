"""bench/power.py: the power of the ledger's paired rule, checked against what it must be."""

import math

import pytest

from rollwise.bench.power import components, minimal_effect, power, seeds_needed


def test_with_no_effect_the_rule_speaks_about_5_percent_of_the_time():
    assert power(0.0, sd_seed=0.06, sd_prompt=0.45, seeds=5, prompts=200) == pytest.approx(0.05, abs=0.01)


def test_with_many_seeds_the_power_is_the_normal_approximations():
    sd = math.sqrt(0.05 ** 2 + 0.45 ** 2 / 1000)
    z = 0.03 / (sd / math.sqrt(40)) - 1.96
    normal = 0.5 * (1 + math.erf(z / math.sqrt(2)))  # Φ(z): the large-S limit
    assert power(0.03, sd_seed=0.05, sd_prompt=0.45, seeds=40, prompts=1000) == pytest.approx(normal, abs=0.03)


def test_power_grows_with_seeds_and_with_prompts_only_while_prompt_noise_matters():
    few, more = (power(0.05, 0.05, 0.45, s, 200) for s in (3, 10))
    assert few < more
    # with training noise dominant, 5x the eval prompts buys little; with none, a lot
    assert power(0.05, 0.08, 0.45, 5, 1000) - power(0.05, 0.08, 0.45, 5, 200) < 0.05
    assert power(0.05, 0.0, 0.45, 5, 1000) - power(0.05, 0.0, 0.45, 5, 200) > 0.3


def test_seeds_needed_is_the_first_count_that_reaches_the_target():
    s = seeds_needed(0.05, sd_seed=0.05, sd_prompt=0.45, prompts=1000)
    assert s is not None and power(0.05, 0.05, 0.45, s, 1000) >= 0.8 > power(0.05, 0.05, 0.45, s - 1, 1000)
    assert seeds_needed(0.05, sd_seed=0.5, sd_prompt=0.45, prompts=1000, max_seeds=10) is None


def test_the_minimal_effect_is_where_the_power_reaches_the_target():
    mde = minimal_effect(sd_seed=0.02, sd_prompt=0.34, seeds=5, prompts=1000)
    assert power(mde, 0.02, 0.34, 5, 1000) >= 0.8 > power(mde - 0.002, 0.02, 0.34, 5, 1000)
    more = minimal_effect(sd_seed=0.02, sd_prompt=0.34, seeds=10, prompts=1000)
    strict = minimal_effect(sd_seed=0.02, sd_prompt=0.34, seeds=5, prompts=1000, level=1 - 0.005)
    assert more < mde < strict  # more seeds see less; a family-wise reading needs more
    assert minimal_effect(sd_seed=0.5, sd_prompt=0.34, seeds=2, prompts=1000) is None


def test_components_take_the_prompt_noise_out_of_the_seed_spread():
    sd_seed, sd_prompt = components([0.04, -0.105, 0.04], prompt_sd=0.5, prompts=200)
    assert sd_seed == pytest.approx(math.sqrt(0.0837158 ** 2 - 0.25 / 200), abs=1e-3) and sd_prompt == 0.5
    assert components([0.01, 0.01], prompt_sd=0.5, prompts=10) == (0.0, 0.5)  # all of it prompt noise
    with pytest.raises(ValueError, match="two seeds"):
        components([0.1], 0.5, 200)


def test_doctests():
    import doctest

    from rollwise.bench import power as module

    assert doctest.testmod(module).failed == 0


def test_bench_power_reads_a_ledgers_noise_floor(tmp_path):
    import json

    from typer.testing import CliRunner

    from rollwise.cli import app

    row = {"seed_differences": [0.02, -0.02, 0.0], "pairs": 600, "prompt_se": 0.4 / math.sqrt(600)}
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"tasks": {"arith": {"noise_floor": row}, "countdown": {}}}))
    out = tmp_path / "power.json"
    result = CliRunner().invoke(app, ["bench", "power", "--set", f"ledger={ledger}", "--set", "task=arith",
                                      "--set", "prompts=[200]", "--set", "seeds=[3,5]", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["pilot"]["sd_prompt"] == pytest.approx(0.4) and data["pilot"]["prompts"] == 200
    plan = data["plans"][0]
    assert plan["power"]["3"] < plan["power"]["5"] and plan["seeds_needed"] == seeds_needed(
        0.05, data["pilot"]["sd_seed"], 0.4, 200)
    assert plan["minimal_effect"]["5"] == minimal_effect(data["pilot"]["sd_seed"], 0.4, 5, 200)
    family = tmp_path / "family.json"  # ten arms read family-wise: the power at α / 10, fewer verdicts
    result = CliRunner().invoke(app, ["bench", "power", "--set", f"ledger={ledger}", "--set", "task=arith",
                                      "--set", "prompts=[200]", "--set", "seeds=[3,5]", "--set", "family=10",
                                      "--json", str(family)])
    assert result.exit_code == 0 and "α = 0.005" in result.output, result.output
    strict = json.loads(family.read_text())["plans"][0]
    assert strict["power"]["5"] < plan["power"]["5"] and strict["seeds_needed"] > plan["seeds_needed"]
    for args, field in (([f"ledger={ledger}"], "'task'"), ([f"ledger={ledger}", "task=countdown"], "'pilot'"),
                        ([f"ledger={tmp_path / 'none.json'}"], "'ledger'")):
        result = CliRunner().invoke(app, ["bench", "power", *[a for x in args for a in ("--set", x)]])
        assert result.exit_code != 0 and field in result.output, result.output
