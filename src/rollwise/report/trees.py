"""The report's rollout tree (``rollout.strategy: tree | latr``): one training prompt's tree from
``trees.jsonl``, each shared span once, nested under its parent, leaves marked correct or wrong."""

from __future__ import annotations

from rollwise.report.html import esc, reasons
from rollwise.report.runs import Run


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
            f"{esc(str(leaf.get('reward')))} · {esc(str(leaf.get('finish_reason')))} · {reasons(leaf.get('reasons'))}"
            f"</span></li>" for leaf in leaves_at.get(nid, []))
        kids = "".join(render(c) for c in children.get(nid, []))
        inner = f"<ul>{kids}{marks}</ul>" if kids or marks else ""
        return f"<li class=\"node\" data-node=\"{nid}\"><code>{esc(node.get('text', ''))}</code> {meta}{inner}</li>"

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
            f"<div class=\"tree-view\" data-run=\"{esc(run.name)}\"><h3>{esc(run.name)}: "
            f"step {esc(str(t.get('step')))} "
            f"({esc(str(strategy))}; {len(run.trees)} trees logged, the last shown)</h3><pre class=\"prompt\">"
            f"{esc(str(t.get('prompt', '')))}</pre><p class=\"meta\">answer <code>{esc(str(t.get('answer')))}</code>; "
            f"each node's text is shared by the leaves below it</p><div class=\"tree\">{_tree_html(t)}</div></div>")
    if not parts:
        return ""
    return "<section id=\"trees\"><h2>Rollout tree: one training prompt</h2>" + "".join(parts) + "</section>"
