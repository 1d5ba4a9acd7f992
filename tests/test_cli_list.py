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
