"""Small HTML pieces the report's sections share. Everything from a run goes through ``esc``
(completions, prompts and reasons are model or user text)."""

from __future__ import annotations

import json
import re
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


# a call block as the built-in formats write it: a tag naming a call (<call>…</call>, <tool_call>…</tool_call>),
# to its closing tag or the end of the turn (an unclosed call). The report shows it marked; it parses nothing.
CALL_BLOCK = re.compile(r"<(\w*call\w*)>.*?(?:</\1>|\Z)", re.DOTALL)


def marked_calls(text: str) -> str:
    """``text`` escaped, each call block in it wrapped in ``<mark class="call">``.

    >>> marked_calls('so <call>f("<")</call>.')
    'so <mark class="call">&lt;call&gt;f(&quot;&lt;&quot;)&lt;/call&gt;</mark>.'
    """
    out, last = [], 0
    for m in CALL_BLOCK.finditer(text):
        out += [esc(text[last:m.start()]), f"<mark class=\"call\">{esc(m.group(0))}</mark>"]
        last = m.end()
    return "".join(out) + esc(text[last:])


def is_error(message: dict) -> bool:
    """A tool message that reports an error (rollwise's tool errors start ``Error:``)."""
    return content_text(message.get("content")).lstrip().startswith("Error:")


def _label(messages: list[dict], i: int) -> tuple[str, str]:
    """(css classes, label) of turn ``i``: a call turn, the final turn, a tool result or a tool error."""
    m = messages[i]
    role = str(m.get("role", ""))
    if role == "tool":
        name = f" · {m['name']}" if m.get("name") else ""
        return ("tool error", f"tool error{name}") if is_error(m) else ("tool", f"tool result{name}")
    if role != "assistant":
        return role, role
    nxt = next((n for n in messages[i + 1:] if isinstance(n, dict)), None)
    if m.get("tool_calls") or (nxt is not None and nxt.get("role") == "tool"):
        return "assistant call", "assistant · tool call"
    if nxt is None:
        return "assistant final", "assistant · final turn (what the reward reads)"
    return role, role


def turn_html(classes: str, label: str, body: str, pre_class: str = "", after: str = "") -> str:
    """One turn: its label, its text (``body``, already escaped) and ``after`` it (the OpenAI calls)."""
    cls = f" class=\"{pre_class}\"" if pre_class else ""
    return (f"<div class=\"turn {esc(classes)}\"><span class=\"role\">{esc(label)}</span><pre{cls}>{body}</pre>"
            f"{after}</div>")


def prompt_html(record: dict, episode: bool) -> str:
    """The prompt's text in a ``<pre class="prompt">``; for an episode as the conversation's first turn, the
    user's, with the prompt as the model saw it (``prompt_rendered``: system message, tool schemas) collapsed."""
    text = esc(str(record.get("prompt", "")))
    if not episode:
        return f"<pre class=\"prompt\">{text}</pre>"
    rendered = record.get("prompt_rendered")
    seen = ("<details class=\"rendered-prompt\"><summary>the prompt as the model saw it (the chat template, its system "
            f"message and tool schemas)</summary><pre>{esc(str(rendered))}</pre></details>" if rendered else "")
    return f"<div class=\"prompt-turns\">{turn_html('user', 'user', text, 'prompt')}{seen}</div>"


def episode_meta(record: dict) -> str:
    """`` · 2 turns · 1 tool result (1 error)`` for an episode; "" for a single completion."""
    messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    if not messages:
        return ""
    turns = sum(m.get("role") == "assistant" for m in messages)
    tools = [m for m in messages if m.get("role") == "tool"]
    errors = sum(is_error(m) for m in tools)
    said = f" · {turns} turn{'s' * (turns != 1)} · {len(tools)} tool result{'s' * (len(tools) != 1)}"
    return said + (f" ({errors} error{'s' * (errors != 1)})" if errors else "")


def completion_html(record: dict) -> str:
    """The completion; a multi-turn episode (``messages``) as its conversation: each assistant turn and
    tool result in order, the calls marked in the text (and OpenAI ``tool_calls`` as the model made them),
    tool errors apart from results, the final turn (what the reward read) named."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return f"<pre class=\"completion\">{esc(str(record.get('completion', '')))}</pre>"
    messages = [m for m in messages if isinstance(m, dict)]
    turns = []
    for i, m in enumerate(messages):
        classes, label = _label(messages, i)
        text = content_text(m.get("content"))
        body = marked_calls(text) if m.get("role") == "assistant" else esc(text)
        calls = f"<pre class=\"calls\">{esc(_calls_text(m['tool_calls']))}</pre>" if m.get("tool_calls") else ""
        turns.append(turn_html(classes, label, body, after=calls))
    return f"<div class=\"conversation\">{''.join(turns)}</div>"
