"""The report as one HTML page: summary, curves, config diff, rollout viewer, rollout tree.

Everything from a run is escaped (completions are model output); the page loads nothing: plots
are data URIs, the style and the sample filter's few lines of script are inline, and with
scripts off every sample is shown.
"""

from __future__ import annotations

import json
from html import escape

from rollwise.report.plots import COLOURS, Figure
from rollwise.report.runs import MISSING, Run, config_diff, sample_correct

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1240px; color: #1d1d1f; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f4f4f6; } figure { margin: 16px 0; } img { width: 100%; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
.sample { border: 1px solid #ddd; border-left: 6px solid #c62828; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
.sample.correct { border-left-color: #2e7d32; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; background: #f7f7f9; padding: 4px 6px; }
.mark.correct, .leaf.correct > .mark { color: #2e7d32; font-weight: 600; }
.mark.wrong, .leaf.wrong > .mark { color: #c62828; font-weight: 600; }
.tree ul { list-style: none; padding-left: 22px; border-left: 1px dashed #bbb; margin: 2px 0; }
.tree code { background: #eef3fb; padding: 1px 4px; white-space: pre-wrap; }
.meta { color: #666; font-size: 12px; } button { margin-right: 6px; }
.turn { margin: 4px 0 4px 12px; } .turn .role { color: #666; font-size: 12px; }
.turn.tool pre { background: #eef7ee; } .turn.assistant pre { background: #f7f7f9; }
"""

FILTER_JS = """
document.getElementById('sample-filter').hidden = false;
document.querySelectorAll('#sample-filter button').forEach(function (b) {
  b.addEventListener('click', function () {
    var want = b.dataset.show;
    document.querySelectorAll('.sample').forEach(function (s) {
      s.hidden = !(want === 'all' || s.dataset.correct === want);
    });
  });
});
"""

def _e(value) -> str:
    return escape(value if isinstance(value, str) else json.dumps(value), quote=True)


def _pct(v) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else MISSING


def _run_label(i: int, run: Run) -> str:
    return f'<span class="swatch" style="background:{COLOURS[i % 10]}"></span>{_e(run.name)}'


def summary_section(runs: list[Run]) -> str:
    rows = []
    for i, run in enumerate(runs):
        h = run.headline()
        method = " + ".join(str(h[k]) for k in ("method", "control", "replay", "mode") if h.get(k))
        wall = h.get("wall_seconds")
        rows.append(
            f"<tr data-run=\"{_e(run.name)}\"><td>{_run_label(i, run)}</td><td>{_e(str(h.get('task')))}</td>"
            f"<td>{_e(method)}</td><td>{_e(str(h.get('steps')))}</td>"
            f"<td class=\"accuracy\">{_pct(h.get('initial_accuracy'))} → {_pct(h.get('final_accuracy'))}</td>"
            f"<td>{f'{wall / 60:.1f} min' if isinstance(wall, (int, float)) else MISSING}</td>"
            f"<td>{h.get('generated_tokens', 0) or 0:,}</td><td>{_e(str(run.path))}</td></tr>")
    return ("<section id=\"summary\"><h2>Summary</h2><table><tr><th>run</th><th>task</th><th>method</th><th>steps</th>"
            "<th>eval accuracy, initial → final</th><th>wall (RL)</th><th>generated tokens</th><th>directory</th></tr>"
            + "".join(rows) + "</table></section>")


def curves_section(figures: list[Figure]) -> str:
    body = "".join(
        f"<figure id=\"curves-{f.id}\" data-metrics=\"{_e(' '.join(f.metrics))}\"><figcaption><b>{_e(f.title)}</b> "
        f"<span class=\"meta\">{_e(', '.join(f.metrics))}</span></figcaption>"
        f"<img alt=\"{_e(f.title)}\" src=\"data:image/png;base64,{f.png}\"></figure>" for f in figures)
    return ("<section id=\"curves\"><h2>Curves</h2><p class=\"meta\">Each row one metric; left to right over training "
            "steps, generated tokens and RL wall time. Only the metrics a run logged.</p>" + body + "</section>")


def config_section(runs: list[Run]) -> str:
    if len(runs) < 2:
        return "<section id=\"config-diff\"><h2>Config diff</h2><p>One run: nothing to compare.</p></section>"
    diff = config_diff([r.config for r in runs])
    head = "<tr><th>key</th>" + "".join(f"<th>{_run_label(i, r)}</th>" for i, r in enumerate(runs)) + "</tr>"
    rows = "".join(f"<tr data-key=\"{_e(k)}\"><td><code>{_e(k)}</code></td>"
                   + "".join(f"<td>{_e(v if isinstance(v, str) else json.dumps(v))}</td>" for v in vals) + "</tr>"
                   for k, vals in diff.items())
    note = f"{len(diff)} keys differ" if diff else "the configs are equal"
    return (f"<section id=\"config-diff\"><h2>Config diff</h2><p class=\"meta\">{note} (config.yaml, flattened)</p>"
            f"<table>{head}{rows}</table></section>")


def _reasons(reasons) -> str:
    if not isinstance(reasons, dict) or not reasons:
        return ""
    return "; ".join(f"{_e(str(k))}: {_e(str(v))}" for k, v in reasons.items())


def _completion_html(sample: dict) -> str:
    """The completion; a multi-turn episode (``messages``) as its conversation: each assistant turn and
    tool result in order, the tool calls as the model wrote them."""
    messages = sample.get("messages")
    if not isinstance(messages, list) or not messages:
        return f"<pre class=\"completion\">{_e(str(sample.get('completion', '')))}</pre>"
    turns = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        who = f"tool {m.get('name', '')}" if role == "tool" else role
        turns.append(f"<div class=\"turn {_e(role)}\"><span class=\"role\">{_e(who)}</span>"
                     f"<pre>{_e(str(m.get('content', '')))}</pre></div>")
    return f"<div class=\"conversation\">{''.join(turns)}</div>"


def samples_section(runs: list[Run]) -> str:
    items = []
    for run in runs:
        for s in run.samples:
            ok = sample_correct(s)
            mark = "correct" if ok else "wrong"
            items.append(
                f"<div class=\"sample {mark}\" data-correct=\"{'true' if ok else 'false'}\" data-run=\"{_e(run.name)}\">"
                f"<div class=\"meta\">{_e(run.name)} · step {_e(str(s.get('step')))} · reward {_e(str(s.get('reward')))}"
                f" · answer <code>{_e(str(s.get('answer')))}</code> · <span class=\"mark {mark}\">"
                f"{'✓ correct' if ok else '✗ wrong'}</span></div>"
                f"<pre class=\"prompt\">{_e(str(s.get('prompt', '')))}</pre>"
                f"{_completion_html(s)}"
                f"<div class=\"reasons\">{_reasons(s.get('reasons'))}</div></div>")
    n_ok = sum(sample_correct(s) for r in runs for s in r.samples)
    buttons = ("<div id=\"sample-filter\" hidden><button data-show=\"all\">all</button>"
               "<button data-show=\"true\">correct</button><button data-show=\"false\">wrong</button></div>")
    return (f"<section id=\"samples\"><h2>Rollouts: eval samples</h2><p class=\"meta\">{len(items)} greedy eval "
            f"rollouts (samples.jsonl), {n_ok} correct, with the reward functions' reasons.</p>{buttons}"
            + "".join(items) + "</section>")


def _tree_html(record: dict) -> str:
    """Nested lists from the root: each node's span once (shared by the leaves below it), leaves marked."""
    nodes = {n["id"]: n for n in record.get("nodes", [])}
    children: dict = {}
    for n in nodes.values():
        children.setdefault(n["parent"], []).append(n["id"])
    leaves_at: dict = {}
    for leaf in record.get("leaves", []):
        if leaf.get("path"):
            leaves_at.setdefault(leaf["path"][-1], []).append(leaf)
    below: dict = {}
    for leaf in record.get("leaves", []):
        for nid in leaf.get("path", []):
            below.setdefault(nid, []).append(bool(leaf.get("correct")))

    def render(nid) -> str:
        node, verdicts = nodes[nid], below.get(nid, [])
        where = "root (the prompt) · " if node.get("parent") is None else f"{node.get('tokens', 0)} tokens · "
        meta = f"<span class=\"meta\">{where}{len(verdicts)} leaves, {sum(verdicts)} correct</span>"
        marks = "".join(
            f"<li class=\"leaf {'correct' if leaf.get('correct') else 'wrong'}\" "
            f"data-correct=\"{'true' if leaf.get('correct') else 'false'}\"><span class=\"mark\">"
            f"{'✓ correct' if leaf.get('correct') else '✗ wrong'}</span> <span class=\"meta\">reward "
            f"{_e(str(leaf.get('reward')))} · {_e(str(leaf.get('finish_reason')))} · {_reasons(leaf.get('reasons'))}"
            f"</span></li>" for leaf in leaves_at.get(nid, []))
        kids = "".join(render(c) for c in children.get(nid, []))
        inner = f"<ul>{kids}{marks}</ul>" if kids or marks else ""
        return f"<li class=\"node\" data-node=\"{nid}\"><code>{_e(node.get('text', ''))}</code> {meta}{inner}</li>"

    roots = children.get(None, [])
    return "<ul class=\"tree\">" + "".join(render(r) for r in roots) + "</ul>"


def trees_section(runs: list[Run]) -> str:
    parts = []
    for run in runs:
        if not run.trees:
            continue
        t = run.trees[-1]
        strategy = (run.config.get("rollout") or {}).get("strategy", "tree")
        parts.append(
            f"<div class=\"tree-view\" data-run=\"{_e(run.name)}\"><h3>{_e(run.name)}: step {_e(str(t.get('step')))} "
            f"({_e(str(strategy))}; {len(run.trees)} trees logged, the last shown)</h3><pre class=\"prompt\">"
            f"{_e(str(t.get('prompt', '')))}</pre><p class=\"meta\">answer <code>{_e(str(t.get('answer')))}</code>; "
            f"each node's text is shared by the leaves below it</p><div class=\"tree\">{_tree_html(t)}</div></div>")
    if not parts:
        return ""
    return "<section id=\"trees\"><h2>Rollout tree: one training prompt</h2>" + "".join(parts) + "</section>"


def render_page(runs: list[Run], figures: list[Figure]) -> str:
    title = "rollwise report: " + ", ".join(r.name for r in runs)
    body = "".join([summary_section(runs), curves_section(figures), config_section(runs), samples_section(runs),
                    trees_section(runs)])
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{_e(title)}</h1>{body}<script>{FILTER_JS}</script></body></html>\n")
