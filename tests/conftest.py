"""Suite-wide settings and the shared tiny-model fixture.

Torch runs one intra-op thread in tests: the models are tiny, and with two threads beside
any other busy process (CI's second job, a parallel test) small matmuls slow down by orders
of magnitude from oversubscription (measured here: 0.17 s → 58 s for one tree-rollout test).
"""

import pytest
import torch
from tinymodel import tiny_redrawn

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): the tiny preset, matrices re-drawn (tests/tinymodel.py). Files may override."""
    return tiny_redrawn()
