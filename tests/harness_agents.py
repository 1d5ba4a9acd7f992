"""Agent harnesses for tests/test_harness.py: they know only the openai client (no rollwise, no torch),
so the harness worker process that imports them starts fast."""

from __future__ import annotations

import os
import time
import zlib

HANG_PROMPT = "hang"  # the prompt text on which `sleeps` and `spins` block their event loop (`exits` exits)


def crc(text: str | None) -> float:
    """A reward that names the text it was computed from (exact in a float: < 2**32)."""
    return float(zlib.crc32((text or "").encode()))


async def two_calls(client, row):
    """Ask, then ask again after the answer: call 2 continues call 1."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    second = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    return float(len(second.choices[0].message.content or "") % 2 == 0)


async def two_calls_crc(client, row):
    """two_calls, rewarded by the text of the last reply it got."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    second = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    return crc(second.choices[0].message.content)


async def main_side_main(client, row):
    """The main conversation, a side call (say, a summary) on another one, then the main one again."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=8)
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "side"}],
                                         max_tokens=8)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    final = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=8)
    return crc(final.choices[0].message.content)


async def n_choices(client, row):
    """One call with n = 3; the harness answers with choice 0."""
    reply = await client.chat.completions.create(model=row["model"], n=3, max_tokens=10,
                                                 messages=[{"role": "user", "content": row["prompt"]}])
    return crc(reply.choices[0].message.content)


async def rewrites_history(client, row):
    """Call 2 drops call 1 from the conversation: a new segment."""
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": row["prompt"]}],
                                         max_tokens=6)
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "other"}],
                                         max_tokens=6)
    return 1.0


async def rewrites_forever(client, row):
    """A fresh conversation on every call, each asking for as many tokens as it may."""
    for i in range(20):  # 20 fresh conversations: each would get the whole budget again if it counted per chain
        await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": f"try {i}"}])
    return 1.0


async def raises(client, row):
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "x"}], max_tokens=4)
    raise RuntimeError("harness bug")


async def hangs(client, row):
    while True:  # a call, then another: one is always in flight when the timeout strikes
        await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "x"}],
                                             max_tokens=400)


async def sleeps(client, row):
    """A blocking call inside the coroutine (as sync HTTP would be) on the hang prompt; else two_calls."""
    if row["prompt"] == HANG_PROMPT:
        time.sleep(3600)
    return await two_calls(client, row)


async def spins(client, row):
    """A pure-Python loop that never yields, on the hang prompt; else two_calls."""
    if row["prompt"] == HANG_PROMPT:
        while True:
            pass
    return await two_calls(client, row)


async def exits(client, row):
    """The process ends under it (os._exit, a crash in an extension) on the hang prompt; else two_calls."""
    if row["prompt"] == HANG_PROMPT:
        os._exit(3)
    return await two_calls(client, row)


def not_async(client, row):
    return 1.0
