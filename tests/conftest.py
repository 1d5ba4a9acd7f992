"""Suite-wide settings.

Torch runs one intra-op thread in tests: the models are tiny, and with two threads beside
any other busy process (CI's second job, a parallel test) small matmuls slow down by orders
of magnitude from oversubscription (measured here: 0.17 s → 58 s for one tree-rollout test).
"""

import torch

torch.set_num_threads(1)


import pytest  # noqa: E402
from tinymodel import tiny_redrawn  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): the tiny preset, matrices re-drawn (tests/tinymodel.py). Files may override."""
    return tiny_redrawn()
