"""``python -m rollwise.cli``: the ``rollwise`` command."""

from rollwise.cli import app

app()
