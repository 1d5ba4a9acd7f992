"""serve.episodes.Episodes on its own: which tags a server keeps, and which it forgets first."""

from __future__ import annotations

import pytest
import torch

from rollwise.engine.engine import Completion
from rollwise.serve.episodes import MB, Call, Choice, Episodes
from rollwise.serve.schema import ApiError


def recorded(episodes: Episodes, tag: str, ids: int = 10, kv_bytes: int = 0) -> None:
    """A call on ``tag`` that recorded ``ids`` ids and kept ``kv_bytes`` of cache, as ChatService records one."""
    log = episodes.touch(tag)
    kv = (torch.zeros(kv_bytes // 4),) if kv_bytes else None
    done = Completion(1, [1], [2], [0.0], [0], "stop", kv=kv)
    log.calls.append(Call([], [Choice([1], [2], [0.0], [0], "stop", completion=done)]))
    log.recorded, log.kv = log.recorded + ids, kv_bytes
    episodes.bound(log)


def test_the_least_recently_used_of_the_servers_own_tags_go_first_and_a_runs_never():
    episodes = Episodes(0, max_episodes=3)
    episodes.open("run", (1, 2, 3))
    for tag in ("a", "b", "c"):
        episodes.touch(tag)
    assert list(episodes) == ["run", "b", "c"]  # a run's tag counts, but only the server's own are forgotten
    episodes.touch("b")  # used again: now the most recent
    episodes.touch("d")
    assert list(episodes) == ["run", "b", "d"]  # c was the least recently used
    assert episodes["run"].run and episodes["run"].key == (1, 2, 3)
    assert episodes.close("run").key == (1, 2, 3) and "run" not in episodes and episodes.close("run") is None


def test_a_tag_first_seen_takes_the_servers_seed_and_its_name():
    one, other = Episodes(0), Episodes(1)
    assert one.touch("x").key == one.touch("x").key != one.touch("y").key
    assert one.touch("x").key != other.touch("x").key and not one["x"].run


def test_recorded_ids_are_bounded_over_the_servers_own_tags():
    episodes = Episodes(0, max_recorded_tokens=25)
    episodes.open("run", (0,))
    recorded(episodes, "run", ids=100)  # a run's record is the run's to close
    for tag in ("a", "b", "c"):
        recorded(episodes, tag, ids=10)
    assert list(episodes) == ["run", "b", "c"]  # 30 > 25: the oldest of its own went, never the run's
    recorded(episodes, "c", ids=30)
    assert list(episodes) == ["run", "c"]  # the tag that just recorded is kept even past the cap


@pytest.mark.parametrize("caps", [{"kv_cache_mb": 2.5}, {"max_cached": 2}], ids=["bytes", "episodes"])
def test_kept_caches_are_bounded_least_recently_used_first(caps):
    episodes = Episodes(0, **({"kv_cache_mb": 100.0, "max_cached": 100} | caps))
    for tag in ("a", "b"):
        recorded(episodes, tag, kv_bytes=MB)
    assert [episodes[t].kv for t in "ab"] == [MB, MB]
    recorded(episodes, "c", kv_bytes=MB)  # 3 MB in 3 caches: over either cap
    assert [episodes[t].kv for t in "abc"] == [0, MB, MB]
    assert episodes["a"].calls[0].choices[0].completion.kv is None  # its cache dropped, its record kept
    assert len(episodes) == 3


def test_only_opened_tags_when_the_endpoint_serves_a_run():
    episodes = Episodes(0, open_tags_only=True)
    episodes.open("mine", (0,))
    assert episodes.touch("mine").run
    with pytest.raises(ApiError, match="episode 'guessed' is not open"):
        episodes.touch("guessed")
    assert "guessed" not in episodes
