"""The engine contract (engine/protocol.py) is what the three samplers really keep: ``Engine`` (v1)
is a ``TokenEngine``, ``SlotEngine`` a ``BranchingEngine``, ``dist.WorkerPool`` a ``PolicySampler``
and a ``RolloutPool`` — every member present on an instance (runtime isinstance) and every
method's parameters the declared ones (names, kinds, defaults). And the check can fail."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollwise.dist import pool as pool_module
from rollwise.dist.pool import RolloutPool, WorkerPool
from rollwise.engine.engine import Engine
from rollwise.engine.protocol import BranchingEngine, PolicySampler, TokenEngine, contract_gaps, protocol_methods
from rollwise.engine.slots import SlotEngine
from rollwise.train.config import load_run_config


class FakeRay:
    """Just enough of ``ray`` for ``WorkerPool.__init__`` (no cluster: actors are placeholders)."""

    def remote(self, cls):
        return SimpleNamespace(options=lambda **kw: SimpleNamespace(remote=lambda *a, **k: object()))


@pytest.fixture(scope="module")
def samplers(tiny):
    model, tok = tiny
    mp = pytest.MonkeyPatch()
    mp.setattr(pool_module, "connect", FakeRay)
    try:
        pool = WorkerPool(load_run_config(None, ["rollout.workers=2"]), model)
    finally:
        mp.undo()
    return {"v1": Engine(model, pad_token_id=tok.pad_token_id),
            "slots": SlotEngine(model, pad_token_id=tok.pad_token_id), "pool": pool}


KEEPS = {  # sampler -> (the contracts it keeps, those it does not)
    "v1": ([PolicySampler, TokenEngine], [BranchingEngine, RolloutPool]),
    "slots": ([PolicySampler, TokenEngine, BranchingEngine], [RolloutPool]),
    "pool": ([PolicySampler, RolloutPool], [TokenEngine]),
}


@pytest.mark.parametrize("name", sorted(KEEPS))
def test_each_sampler_keeps_its_contract(samplers, name):
    sampler = samplers[name]
    keeps, not_kept = KEEPS[name]
    for protocol in keeps:
        assert isinstance(sampler, protocol), protocol.__name__
        assert contract_gaps(type(sampler), protocol) == []
    for protocol in not_kept:
        assert not isinstance(sampler, protocol) or contract_gaps(type(sampler), protocol), protocol.__name__


def test_the_tiers_build_on_each_other():
    assert set(protocol_methods(PolicySampler)) == {"load_weights"}
    assert set(protocol_methods(TokenEngine)) == {"load_weights", "submit", "step", "run_until", "generate"}
    assert set(protocol_methods(BranchingEngine)) - set(protocol_methods(TokenEngine)) == {
        "peek", "fork", "pause", "resume", "abort", "keep_prefixes"}
    assert set(protocol_methods(RolloutPool)) == {"load_weights", "generate", "generator_state",
                                                  "load_generator_state", "close"}


def test_a_departing_backend_is_named():
    """A backend whose fork lost a parameter, whose pause renamed one and that has no abort."""

    class Drifted(SlotEngine):
        def fork(self, handle, n, params=None):
            ...

        def pause(self, handles, keep_kv=False):
            ...

    Drifted.abort = None
    gaps = contract_gaps(Drifted, BranchingEngine)
    assert [g.split(":")[0].split("(")[0].split("[")[0] for g in gaps] == ["Drifted.fork", "Drifted.pause",
                                                                           "Drifted.abort"]
    assert "replace_last" in gaps[0] and "keep_kv" in gaps[1] and gaps[2] == "Drifted.abort: missing"
    assert contract_gaps(Engine, BranchingEngine) == [f"Engine.{m}: missing" for m in
                                                      ("peek", "fork", "pause", "resume", "abort", "keep_prefixes")]
