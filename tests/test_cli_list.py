"""``rollwise list`` prints plain text: docstrings' reStructuredText markup is not shown."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from rollwise.cli import app, plain_summary


def test_plain_summary_by_hand():
    assert plain_summary("1.0 when the number after the final ``#`` equals ``answer``, else 0.0; the\n"
                         "    number read (``Score.answer``) is what maj@k votes with.\n\n    More.") == (
        "1.0 when the number after the final # equals answer, else 0.0; the number read (Score.answer) is "
        "what maj@k votes with.")
    assert plain_summary(":func:`check` each `row`") == "check each row"
    assert plain_summary(None) == ""
    assert plain_summary("rollouts (rollout.tree.*)") == "rollouts (rollout.tree.*)"  # plain text kept as it is


def test_list_prints_no_markup():
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "`" not in result.output
    rewards = result.output.split("rewards\n", 1)[1]
    assert re.search(r"^  arith +1\.0 when the number after the final # equals answer, .* votes with\.$", rewards, re.M)
    assert "shaping=['ace']" in result.output  # square brackets are text, not console markup


def test_the_check_can_fail():
    """The markup the listing must not show is there in the docstrings it reads."""
    from rollwise.filter.registry import builtin_rewards

    assert "``#``" in builtin_rewards()["arith"].__doc__


def test_list_shows_environments():
    """The built-in ``rollout.environment`` names are listed with what they do and their tools."""
    from rollwise.tasks.environment import ENVIRONMENTS

    result = CliRunner().invoke(app, ["list", "environments"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("environments\n")
    for name in ENVIRONMENTS:
        assert re.search(rf"^  {name} +\S", result.output, re.M), result.output
    assert re.search(r"^  calculator +Exact arithmetic as a tool\. tools: calculate$", result.output, re.M)
    assert re.search(r"^  python_tool +.*tools: run_python$", result.output, re.M)
    assert "openenv:<url>" in result.output  # the other form rollout.environment takes
    assert "environments\n" in CliRunner().invoke(app, ["list"]).output


def test_one_row_per_objective_with_its_aliases():
    """``sapo_gate`` is the catalogue's id for the ``sapo`` preset: one row, the alias named in it."""
    from rollwise.optim.objective import PRESETS

    result = CliRunner().invoke(app, ["list", "objectives"])
    assert result.exit_code == 0, result.output
    keys = re.findall(r"^  (\S+)", result.output, re.M)
    assert "sapo" in keys and "sapo_gate" not in keys
    assert re.search(r"^  sapo +\(also sapo_gate\) policy_loss=sapo", result.output, re.M), result.output
    assert len(keys) == len({id(p) for p in PRESETS.values()})  # every preset once, none dropped


# the catalogue's ids (shared METHODS.md, 56): each is a row of `rollwise list` or named in the row of its class
METHOD_IDS = """token_faithful april treepo latr brorl guide nudge scope overlong_shaping fapo weaver test_threshold
io_verifier majority_vote pow3r dynamic_sampling arrol xrpo_alloc gdro vade difficulty_select dars clpo masa trace
rollout_replay remix rorecomp ppo_clip grpo dr_grpo dapo_clip_higher gspo rloo reinforce_pp_baseline cispo
kl_estimators tis_mis mc_grpo ace novelty_sharpen poise v05 minpro sapo_gate tree_adv gigpo drpo concise_r dph_rl
dagrpo high_entropy_steps staleness_async old_logit_repair vcpo support_diag""".split()


def test_every_catalogue_id_is_listed():
    """`rollwise list` names every METHODS id: as a row, or in the row of the component it is a setting of."""
    assert len(METHOD_IDS) == 56
    output = CliRunner().invoke(app, ["list"]).output
    missing = [m for m in METHOD_IDS if not re.search(rf"(?<![\w.]){m}(?![\w])", output)]
    assert not missing, missing
    settings = CliRunner().invoke(app, ["list", "settings"]).output
    for name in ("treepo", "tree_adv", "kl_estimators", "tis_mis", "staleness_async", "token_faithful"):
        assert re.search(rf"^  {name} +[a-z]+\.[a-z_]+", settings, re.M), settings  # the setting it is
