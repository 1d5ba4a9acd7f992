"""Small HTML pieces the report's sections share. Everything from a run goes through ``esc``
(completions, prompts and reasons are model or user text)."""

from __future__ import annotations

import json
from html import escape

from rollwise.report.runs import MISSING, Run

# one colour per run, in the plots and in the page (matplotlib's tab10)
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def esc(value) -> str:
    return escape(value if isinstance(value, str) else json.dumps(value), quote=True)


def pct(v) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else MISSING


def num(v, digits: int = 3) -> str:
    """A number for a table cell: ``digits`` significant digits, ``—`` when absent."""
    return f"{v:.{digits}g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else MISSING


def run_label(i: int, run: Run) -> str:
    return f'<span class="swatch" style="background:{COLOURS[i % 10]}"></span>{esc(run.name)}'


def mark(correct: bool) -> str:
    kind = "correct" if correct else "wrong"
    return f"<span class=\"mark {kind}\">{'✓' if correct else '✗'}</span>"


def reasons(reasons_by_fn) -> str:
    if not isinstance(reasons_by_fn, dict) or not reasons_by_fn:
        return ""
    return "; ".join(f"{esc(str(k))}: {esc(str(v))}" for k, v in reasons_by_fn.items())


def content_text(content) -> str:
    """A message's content as text: OpenAI content parts' text joined, None (a call-only turn) as ""."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _calls_text(calls) -> str:
    """OpenAI tool calls as ``name(arguments)`` lines, the arguments as the model wrote them."""
    lines = []
    for c in calls if isinstance(calls, list) else [calls]:
        fn = c.get("function", c) if isinstance(c, dict) else {}
        args = fn.get("arguments", "")
        lines.append(f"{fn.get('name', '?')}({args if isinstance(args, str) else json.dumps(args)})" if fn else str(c))
    return "\n".join(lines)


def completion_html(record: dict) -> str:
    """The completion; a multi-turn episode (``messages``) as its conversation: each assistant turn and
    tool result in order, the tool calls as the model wrote them."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return f"<pre class=\"completion\">{esc(str(record.get('completion', '')))}</pre>"
    turns = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        who = f"tool {m.get('name', '')}" if role == "tool" else role
        calls = f"<pre class=\"calls\">{esc(_calls_text(m['tool_calls']))}</pre>" if m.get("tool_calls") else ""
        turns.append(f"<div class=\"turn {esc(role)}\"><span class=\"role\">{esc(who)}</span>"
                     f"<pre>{esc(content_text(m.get('content')))}</pre>{calls}</div>")
    return f"<div class=\"conversation\">{''.join(turns)}</div>"
