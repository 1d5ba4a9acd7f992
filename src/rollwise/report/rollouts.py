"""The report's rollout sections: training rollouts (``rollouts.jsonl``), eval samples grouped by
prompt (``samples.jsonl``) and the rollout tree (``trees.jsonl``).

The page stays short with any run length: at most ``STEPS_SHOWN`` logged steps (evenly spaced,
first and last included), each a collapsed ``<details>`` but the last; an eval prompt is one
collapsed card whose summary is its verdict at each eval. With scripts off everything still opens.
"""

from __future__ import annotations

from rollwise.report.html import completion_html, episode_meta, esc, mark, num, prompt_html, reasons
from rollwise.report.runs import Run, sample_correct

STEPS_SHOWN = 8


def evenly_spaced(items: list, n: int) -> list:
    """At most ``n`` of ``items``, spread evenly, the first and the last included.

    >>> evenly_spaced(list(range(1, 11)), 4)
    [1, 4, 7, 10]
    >>> evenly_spaced([1, 2], 4)
    [1, 2]
    """
    if len(items) <= n:
        return list(items)
    if n <= 1:
        return items[-1:]
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def _components(rollout: dict) -> str:
    """Each reward function's value and its reason, one per line."""
    comps, why = rollout.get("components") or {}, rollout.get("reasons") or {}
    lines = [f"<b>{esc(str(k))}</b> {num(comps.get(k))}" + (f" — {esc(str(why[k]))}" if why.get(k) else "")
             for k in list(comps) + [k for k in why if k not in comps]]
    if rollout.get("failure"):
        lines.append(f"<b>failed</b> — {esc(str(rollout['failure']))}")
    return "<br>".join(lines)


def _rollout_row(i: int, r: dict) -> str:
    ok = bool(r.get("correct"))
    return (f"<tr class=\"rollout {'correct' if ok else 'wrong'}\" data-correct=\"{'true' if ok else 'false'}\">"
            f"<td>{i}</td><td>{mark(ok)} {num(r.get('reward'))}</td>"
            f"<td class=\"advantage\">{num(r.get('advantage'))}</td>"
            f"<td class=\"reasons\">{_components(r)}</td><td>{completion_html(r)}<span class=\"meta\">"
            f"{esc(str(r.get('finish_reason')))} · {esc(str(r.get('tokens')))} tokens{esc(episode_meta(r))}</span>"
            "</td></tr>")


def _group_html(g: dict) -> str:
    spread = ("no reward spread: advantages 0, nothing trained on this group" if g.get("zero_signal")
              else "rewards spread: trained")
    rows = "".join(_rollout_row(i, r) for i, r in enumerate(g.get("rollouts") or [], 1))
    episode = any(r.get("messages") for r in g.get("rollouts") or [])  # shown as a conversation from the prompt on
    return (f"<div class=\"group\" data-prompt-id=\"{esc(str(g.get('prompt_id')))}\"><div class=\"meta\">prompt "
            f"{esc(str(g.get('prompt_id')))} · answer <code>{esc(str(g.get('answer')))}</code> · pass rate "
            f"{num(g.get('pass_rate'), 2)} · {spread}</div>{prompt_html(g, episode)}"
            "<table class=\"rollouts\"><tr><th>#</th><th>reward</th><th>advantage</th><th>reward functions: value — "
            f"reason</th><th>completion</th></tr>{rows}</table></div>")


def _run_rollouts(run: Run) -> str:
    by_step: dict[int, list[dict]] = {}
    for g in run.rollouts:
        by_step.setdefault(g.get("step", 0), []).append(g)
    steps = sorted(by_step)
    shown = evenly_spaced(steps, STEPS_SHOWN)
    blocks = []
    for s in shown:
        groups = by_step[s]
        rewards = [r.get("reward") or 0.0 for g in groups for r in g.get("rollouts") or []]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        blocks.append(f"<details class=\"train-step\" data-step=\"{s}\" data-run=\"{esc(run.name)}\""
                      f"{' open' if s == shown[-1] else ''}><summary>step {s} · {len(groups)} groups · mean reward "
                      f"{mean:.2f}</summary>{''.join(_group_html(g) for g in groups)}</details>")
    note = f"{len(shown)} of {len(steps)} logged steps shown, evenly spaced" if len(shown) < len(steps) else (
        f"{len(steps)} logged steps")
    return f"<div class=\"run-rollouts\" data-run=\"{esc(run.name)}\"><p class=\"meta\">{esc(run.name)}: {note}</p>" + (
        "".join(blocks) + "</div>")


def training_rollouts_section(runs: list[Run]) -> str:
    parts = [_run_rollouts(r) for r in runs if r.rollouts]
    body = "".join(parts) or ("<p>No training rollouts logged: <code>rollouts.jsonl</code> is written by runs with "
                              "<code>train.log_rollouts</code> &gt; 0 (the default 2).</p>")
    return ("<section id=\"rollouts\"><h2>Training rollouts</h2><p class=\"meta\">A sample of the groups each step "
            "trained on (<code>rollouts.jsonl</code>): every rollout's text, its reward, each reward function's value "
            "and reason, and its advantage (the mean over its tokens).</p>" + body + "</section>")


def _eval_cards(runs: list[Run]) -> dict[tuple, list[tuple[Run, dict]]]:
    """Eval samples by prompt (text and answer), in the order first seen, each with its run."""
    cards: dict[tuple, list[tuple[Run, dict]]] = {}
    for run in runs:
        for s in run.samples:
            cards.setdefault((str(s.get("prompt", "")), str(s.get("answer"))), []).append((run, s))
    return cards


def _eval_card(prompt: str, answer: str, entries: list[tuple[Run, dict]], multi: bool) -> str:
    trail = " ".join(("✓" if sample_correct(s) else "✗") for _, s in entries)
    first_line = prompt.strip().splitlines()[0] if prompt.strip() else ""
    first_line = first_line if len(first_line) <= 100 else first_line[:100] + "…"
    episode = any(s.get("messages") for _, s in entries)  # shown as a conversation from the prompt on
    rows = []
    for run, s in entries:
        ok = sample_correct(s)
        who = f"{esc(run.name)} · " if multi else ""
        rows.append(f"<div class=\"sample {'correct' if ok else 'wrong'}\" "
                    f"data-correct=\"{'true' if ok else 'false'}\" "
                    f"data-run=\"{esc(run.name)}\" data-step=\"{esc(str(s.get('step')))}\"><div class=\"meta\">{who}"
                    f"step {esc(str(s.get('step')))} · {mark(ok)} reward {num(s.get('reward'))}"
                    f"{esc(episode_meta(s))}</div>"
                    f"{completion_html(s)}<div class=\"reasons\">{reasons(s.get('reasons'))}</div></div>")
    return (f"<details class=\"eval-prompt\"><summary><code>{esc(first_line)}</code> · answer <code>{esc(answer)}"
            f"</code> · <span class=\"trail\">{trail}</span></summary>{prompt_html(entries[0][1], episode)}"
            + "".join(rows) + "</details>")


def eval_samples_section(runs: list[Run]) -> str:
    cards = _eval_cards(runs)
    n = sum(len(v) for v in cards.values())
    n_ok = sum(sample_correct(s) for v in cards.values() for _, s in v)
    body = "".join(_eval_card(p, a, entries, len(runs) > 1) for (p, a), entries in cards.items())
    return (f"<section id=\"samples\"><h2>Eval samples, by prompt</h2><p class=\"meta\">{len(cards)} eval prompts, "
            f"{n} greedy completions ({n_ok} correct) from <code>samples.jsonl</code>: one card per prompt, its "
            "completion at each eval in order (✓ / ✗ in the summary), with the reward functions' reasons.</p>"
            + body + "</section>")
