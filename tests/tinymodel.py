"""The tiny model the engine and generation tests share.

Its matrices are re-drawn at std .15 so greedy and sampled completions vary and do end in EOS
(the preset's own init is too flat to ever pick EOS).
"""

import torch

from rollwise.model.tiny import build_tiny


def redraw(model, std=0.15, seed=0):
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std, generator=gen)
    return model.eval()


def tiny_redrawn():
    model, tok = build_tiny("tiny", seed=0)
    return redraw(model), tok
