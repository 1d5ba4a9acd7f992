"""The run report and the loggers of ``train.report_to``.

Two real tiny runs (``group`` through the ``rollwise train`` CLI, which writes the report at the
end; ``tree`` through ``Trainer``) and a copy of the tree run with hostile text appended to its
logs. The HTML is parsed (stdlib ``html.parser``) section by section and opened in headless
Chromium, whose screenshot must show the page; the loggers write their own files only when chosen.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.report import write_report
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.metrics import MetricsLog

FAST = [
    "task.max_digits=2", "task.eval_size=8", "rollout.prompts_per_step=4", "rollout.num_generations=4",
    "rollout.max_new_tokens=24", "train.eval_samples=2", "optim.micro_batch_size=8", "model.threads=1",
    "sft.steps=10", "train.steps=4", "train.eval_every=2", "train.log_samples=8",
]
TREE = ["rollout.strategy=tree", "optim.lr=2e-4"]  # the tree run differs from the group run in these keys (and name)

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>&amp; \"quoted\""


# -- a small DOM from html.parser ----------------------------------------------------------
VOID = {"img", "meta", "br", "input", "hr", "link"}


class El:
    def __init__(self, tag: str, attrs: dict, parent: "El | None"):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list["El"]:
        out = []
        for c in self.children:
            if isinstance(c, El):
                if ((tag is None or c.tag == tag) and (cls is None or cls in c.classes())
                        and all(c.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())):
                    out.append(c)
                out.extend(c.find_all(tag, cls, **attrs))
        return out

    def by_id(self, id_: str) -> "El":
        found = self.find_all(id=id_)
        assert len(found) == 1, (id_, len(found))
        return found[0]


class Dom(HTMLParser):
    def __init__(self, html: str):
        super().__init__()
        self.root = self.current = El("#root", {}, None)
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        el = El(tag, dict(attrs), self.current)
        self.current.children.append(el)
        if tag not in VOID:
            self.current = el

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(El(tag, dict(attrs), self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(path: Path) -> El:
    return Dom(path.read_text(encoding="utf-8")).root


def jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


# -- the runs -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    sets = [f"output_dir={root}", *FAST]
    args = sum((["--set", s] for s in [*sets, "name=group"]), [])
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    with Trainer(load_run_config(None, [*sets, "name=tree", *TREE])) as trainer:
        trainer.prepare()
        trainer.fit()
    tree_report = trainer.write_report()
    # the tree run again, with model-written text that is hostile HTML, a correct sample and a correct leaf
    hostile = root / "hostile"
    shutil.copytree(root / "tree", hostile, ignore=shutil.ignore_patterns("checkpoints", "init_model", "report.html"))
    with (hostile / "samples.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "prompt": "1+1=" + HOSTILE, "completion": HOSTILE, "reward": 1.0,
                            "reasons": {"arith": "ok " + HOSTILE}, "answer": HOSTILE}) + "\n")
        f.write(json.dumps({"step": 4, "prompt": "6*7=", "completion": "x", "reward": 1.0, "reasons": {},
                            "answer": "42",
                            "messages": EPISODE}) + "\n")
    tree = jsonl(hostile / "trees.jsonl")[-1]
    tree["nodes"][-1]["text"] = HOSTILE
    tree["leaves"][0] |= {"correct": True, "reward": 1.0}
    with (hostile / "trees.jsonl").open("a") as f:
        f.write(json.dumps(tree) + "\n")
    group = jsonl(hostile / "rollouts.jsonl")[-1]
    group["rollouts"][0] |= {"completion": HOSTILE, "reasons": {"arith": "why " + HOSTILE}, "messages": EPISODE}
    with (hostile / "rollouts.jsonl").open("a") as f:
        f.write(json.dumps(group) + "\n")
    return {"root": root, "group": root / "group", "tree": root / "tree", "hostile": hostile,
            "trainer": trainer, "tree_report": tree_report}


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """A 30-step run (evals every 10 steps): what the page's length is judged on."""
    sets = [f"output_dir={tmp_path_factory.mktemp('long')}", *FAST, "name=long", "train.steps=30",
            "train.eval_every=10", "train.checkpoint_every=0"]
    with Trainer(load_run_config(None, sets)) as trainer:
        trainer.prepare()
        trainer.fit()
    return trainer.write_report()


EPISODE = [{"role": "assistant", "content": '<tool_call>{"name": "calculate"}</tool_call>' + HOSTILE},
           {"role": "tool", "name": "calculate", "content": "42"}, {"role": "assistant", "content": "42"}]


@pytest.fixture(scope="module")
def both(runs):
    out = write_report([runs["group"], runs["tree"]], runs["root"] / "both.html")
    return out, parse(out)


def test_train_writes_the_report_and_trees(runs):
    """`rollwise train` and `Trainer.write_report` leave report.html in the run dir; tree runs log one tree
    per eval after a step (not the initial eval), group runs none; no logger runs unless chosen."""
    assert (runs["group"] / "report.html").exists() and runs["tree_report"] == runs["tree"] / "report.html"
    assert not (runs["group"] / "trees.jsonl").exists()
    assert [t["step"] for t in jsonl(runs["tree"] / "trees.jsonl")] == [2, 4]
    for run in ("group", "tree"):  # tensorboard and wandb are installed, but report_to is empty
        assert not (runs[run] / "tensorboard").exists() and not (runs[run] / "wandb").exists()
    for t in jsonl(runs["tree"] / "trees.jsonl"):
        ids = {n["id"] for n in t["nodes"]}
        assert len(t["leaves"]) == 4 and all(set(leaf["path"]) <= ids for leaf in t["leaves"])
        assert sum(n["tokens"] for n in t["nodes"]) < sum(
            sum(n["tokens"] for n in t["nodes"] if n["id"] in leaf["path"]) for leaf in t["leaves"])  # shared


def test_every_section_of_one_run_top_down(runs):
    """Result, config, curves, training rollouts, eval samples, tree: in that order, the config shown."""
    dom = parse(runs["tree"] / "report.html")
    order = [el.attrs["id"] for el in dom.find_all("section")]
    assert order == ["summary", "config", "curves", "rollouts", "samples", "trees"]
    summary = json.loads((runs["tree"] / "summary.json").read_text())
    (head,) = dom.by_id("summary").find_all("div", cls="run-headline", data_run="tree")
    assert head.find_all("b", cls="accuracy")[0].text() == (
        f"{summary['initial_accuracy']:.1%} → {summary['final_accuracy']:.1%}")
    cost = head.find_all("p", cls="cost")[0].text()
    assert f"{summary['generated_tokens']:,} generated tokens" in cost and "4 RL steps" in cost
    assert "arith" in cost and "grpo" in cost
    (config,) = dom.by_id("config").find_all("pre", cls="config")  # one run: its whole config.yaml, collapsed
    assert "strategy: tree" in config.text() and config.parent.tag == "details"
    assert not parse(runs["group"] / "report.html").find_all(id="trees")  # no tree strategy, no tree section


def _curve_items(dom: El) -> list[list[str]]:
    """The metrics of each plotted curve (the key ones once: not their copies over other axes) and each flat row."""
    curves = dom.by_id("curves")
    axes = {id(f) for f in curves.find_all("figure") if f.parent.attrs.get("id") == "curves-axes"}
    figures = [f.attrs["data-metrics"].split() for f in curves.find_all("figure") if id(f) not in axes]
    return figures + [tr.attrs["data-metrics"].split() for tr in curves.find_all("tr") if "data-metrics" in tr.attrs]


def test_curves_merge_equal_series_and_fold_flat_ones(runs):
    """Each logged metric once: a curve stands for metrics whose series are equal (one 0/1 reward: reward/mean,
    reward/arith, train/pass_rate), a constant series is a row of the collapsed flat list, not a plot."""
    dom = parse(runs["tree"] / "report.html")
    items = _curve_items(dom)
    plotted = [m for item in items for m in item]
    metrics = jsonl(runs["tree"] / "metrics.jsonl")
    logged = {k for m in metrics for k, v in m.items() if k != "step" and isinstance(v, float)}
    assert sorted(plotted) == sorted(logged)  # each logged metric once; nothing not logged

    def series(name):
        return [(m["step"], round(m[name], 6)) for m in metrics if name in m]

    (reward,) = [item for item in items if "reward/mean" in item]
    assert {"reward/arith", "train/pass_rate"} <= set(reward)
    for item in items:  # what one item stands for is one series; two items are two different series
        assert all(series(n) == series(item[0]) for n in item), item
    assert len({tuple(series(item[0])) for item in items}) == len(items)
    flat = dom.by_id("curves-flat")
    assert flat.tag == "details" and "open" not in flat.attrs
    folded = {m for tr in flat.find_all("tr") if "data-metrics" in tr.attrs for m in tr.attrs["data-metrics"].split()}
    assert {"staleness/mean", "staleness/max", "update/skipped_nonfinite"} <= folded  # a sync run: always 0
    assert f"{len(folded)} more metrics, flat" in flat.find_all("summary")[0].text()
    for f in dom.by_id("curves").find_all("figure"):
        (img,) = f.find_all("img")
        prefix = "data:image/png;base64,"
        assert img.attrs["src"].startswith(prefix)
        png = base64.b64decode(img.attrs["src"][len(prefix):])
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000


def _png_width(figure: El) -> int:
    png = base64.b64decode(figure.find_all("img")[0].attrs["src"].split(",", 1)[1])
    return int.from_bytes(png[16:20], "big")


def test_one_run_plots_over_steps_several_over_three_axes(runs, both):
    """One run: the key curves over steps, side by side, the same over tokens and wall time collapsed; the
    other groups collapsed. Several runs: overlaid over steps, generated tokens and wall time."""
    curves = parse(runs["tree"] / "report.html").by_id("curves")
    key = [f for f in curves.find_all("figure") if f.attrs["id"].startswith("curve-key-")]
    assert key and key[0].parent.attrs.get("class") == "grid"
    widths = {_png_width(f) for f in key}
    (other_axes,) = [d for d in curves.find_all("details") if d.attrs.get("id") == "curves-axes"]
    assert "open" not in other_axes.attrs and len(other_axes.find_all("figure")) == len(key)
    assert all(_png_width(f) > 1.5 * max(widths) for f in other_axes.find_all("figure"))  # two axes
    more = curves.find_all("details", cls="more-curves")
    assert more and all("open" not in d.attrs for d in more)
    assert any(d.attrs["id"] == "curves-time" for d in more)
    _, dom = both
    both_key = [f for f in dom.by_id("curves").find_all("figure") if f.attrs["id"].startswith("curve-key-")]
    assert all(_png_width(f) > 2.5 * max(widths) for f in both_key) and not dom.find_all(id="curves-axes")


def test_two_runs_overlaid_with_their_config_diff(runs, both):
    _, dom = both
    keys = {tr.attrs["data-key"] for tr in dom.by_id("config").find_all("tr") if "data-key" in tr.attrs}
    assert keys == {"name", "rollout.strategy", "optim.lr"}
    row = dom.by_id("config").find_all("tr", data_key="rollout.strategy")[0]
    assert [td.text() for td in row.find_all("td")] == ["rollout.strategy", "group", "tree"]
    assert len(dom.by_id("summary").find_all("div", cls="run-headline")) == 2
    assert len(dom.by_id("summary").find_all("tr")) == 3  # header + one row per run
    # tree/* was logged by one run only: it is plotted (or listed), the other run simply has no line there
    assert any("tree/forks" in item for item in _curve_items(dom))


def test_training_rollouts_section_shows_rewards_reasons_and_advantages(runs, long_run):
    """Each logged step a collapsed block (the last open), each group its prompt and a row per rollout: reward,
    advantage, every reward function's value and reason, the completion. A long run shows a few steps, evenly."""
    dom = parse(runs["tree"] / "report.html")
    logged = jsonl(runs["tree"] / "rollouts.jsonl")
    blocks = dom.by_id("rollouts").find_all("details", cls="train-step")
    assert [b.attrs["data-step"] for b in blocks] == ["1", "2", "3", "4"]
    assert ["open" in b.attrs for b in blocks] == [False, False, False, True]
    last = [g for g in logged if g["step"] == 4]
    groups = blocks[-1].find_all("div", cls="group")
    assert len(groups) == len(last) == 2
    for div, g in zip(groups, last):
        assert div.find_all("pre", cls="prompt")[0].text() == g["prompt"]
        rows = div.find_all("tr", cls="rollout")
        assert len(rows) == len(g["rollouts"]) == 4
        for tr, r in zip(rows, g["rollouts"]):
            assert tr.find_all("pre", cls="completion")[0].text() == r["completion"]
            assert r["reasons"]["arith"] in tr.find_all("td", cls="reasons")[0].text()
            assert tr.find_all("td", cls="advantage")[0].text() == f"{r['advantage']:.3g}"
            assert tr.attrs["data-correct"] == ("true" if r["correct"] else "false")
    steps = [b.attrs["data-step"] for b in parse(long_run).by_id("rollouts").find_all("details", cls="train-step")]
    assert steps[0] == "1" and steps[-1] == "30" and len(steps) == 8


def test_eval_samples_one_card_per_prompt(runs, both):
    """The same eval prompts at every eval are one card each: the verdicts in order in its summary, then each
    eval's completion (both runs' in a two-run report) with the reward functions' reasons."""
    _, dom = both
    cards = dom.by_id("samples").find_all("details", cls="eval-prompt")
    logged = {run: jsonl(runs[run] / "samples.jsonl") for run in ("group", "tree")}
    prompts = list(dict.fromkeys(s["prompt"] for s in logged["group"]))
    assert len(cards) == len(prompts) == 8
    for card, prompt in zip(cards, prompts):
        assert card.find_all("pre", cls="prompt")[0].text() == prompt
        mine = [(run, s) for run in ("group", "tree") for s in logged[run] if s["prompt"] == prompt]
        shown = card.find_all("div", cls="sample")
        assert [(d.attrs["data-run"], d.attrs["data-step"]) for d in shown] == [(r, str(s["step"])) for r, s in mine]
        assert [(d.attrs["data-run"], int(d.attrs["data-step"])) for d in shown][:3] == [
            ("group", 0), ("group", 2), ("group", 4)]
        for d, (_, s) in zip(shown, mine):
            assert d.find_all("pre", cls="completion")[0].text() == s["completion"]
            assert all(reason in d.find_all("div", cls="reasons")[0].text() for reason in s["reasons"].values())
            assert d.attrs["data-correct"] == ("true" if s["reward"] > 0.5 else "false")
        trail = card.find_all("span", cls="trail")[0].text()
        assert trail == " ".join("✓" if s["reward"] > 0.5 else "✗" for _, s in mine)


def test_tree_shows_shared_prefixes_and_marked_leaves(runs):
    out = write_report([runs["hostile"]])
    dom = parse(out)
    tree = jsonl(runs["hostile"] / "trees.jsonl")[-1]
    view = dom.by_id("trees")
    leaves = view.find_all("li", cls="leaf")
    assert len(leaves) == len(tree["leaves"])
    assert sorted(li.attrs["data-correct"] for li in leaves) == sorted(
        "true" if leaf["correct"] else "false" for leaf in tree["leaves"])
    assert any("✓ correct" in li.text() for li in leaves) and any("✗ wrong" in li.text() for li in leaves)
    for node in tree["nodes"]:  # each node's text once, under its parent's list item
        (li,) = view.find_all("li", data_node=str(node["id"]))
        assert li.find_all("code")[0].text() == node["text"]
        if node["parent"] is not None:
            assert li.parent.parent.attrs["data-node"] == str(node["parent"])
    for leaf in tree["leaves"]:  # a leaf hangs under the last node of its path
        assert any(li.parent.parent.attrs["data-node"] == str(leaf["path"][-1]) for li in leaves)


def test_hostile_text_renders_as_text(runs):
    out = write_report([runs["hostile"]], runs["root"] / "hostile.html")
    dom = parse(out)
    assert not dom.find_all("script")  # the page runs no script, and nothing from the run became one
    assert not [el for el in dom.find_all() if "onerror" in el.attrs]
    assert len(dom.find_all("img")) == len(dom.by_id("curves").find_all("img"))
    (row,) = [tr for tr in dom.by_id("rollouts").find_all("tr", cls="rollout") if "why " + HOSTILE in tr.text()]
    turns = row.find_all("div", cls="turn")  # a training episode: its conversation, escaped
    assert [t.find_all("pre")[0].text() for t in turns] == [m["content"] for m in EPISODE]
    completions = [pre.text() for pre in dom.by_id("samples").find_all("pre", cls="completion")]
    assert completions[-1] == HOSTILE  # shown as the characters the model wrote
    # a multi-turn episode is shown as its conversation: turns and tool results in order, escaped
    (conversation,) = dom.by_id("samples").find_all("div", cls="conversation")  # an eval episode
    turns = conversation.find_all("div", cls="turn")
    assert [t.find_all("span", cls="role")[0].text() for t in turns] == [
        "assistant · tool call", "tool result · calculate", "assistant · final turn (what the reward reads)"]
    assert [t.find_all("pre")[0].text() for t in turns] == [m["content"] for m in EPISODE]
    assert any(code.text() == HOSTILE for code in dom.by_id("trees").find_all("code"))
    raw = out.read_text()
    assert "<script>alert" not in raw and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in raw


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1200,2000"]

# measures the laid-out page from inside (a copy of the report with this appended; the report itself has no script)
MEASURE = """<script>
var b = document.body, r = document.getElementById('rollouts');
b.setAttribute('data-height', document.documentElement.scrollHeight);
var shown = r ? Array.prototype.filter.call(r.querySelectorAll('td.reasons'),
                                           function (td) { return td.offsetParent; }) : [];
b.setAttribute('data-rollouts-top', r ? r.getBoundingClientRect().top + window.scrollY : -1);
b.setAttribute('data-reason-shown', shown.length ? shown[0].textContent : '');
</script>"""


def _chromium(tmp_path: Path) -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (`make install` installs it with apt-get when run as root)")
    return chromium


def test_report_in_a_headless_browser(runs, both, tmp_path):
    """Debian's Chromium renders the page: the screenshot shows text, tables and both runs' curve colours."""
    chromium = _chromium(tmp_path)
    import matplotlib.image

    out, _ = both
    shot = tmp_path / "shot.png"
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}"]
    subprocess.run([chromium, *flags, out.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    pixels = matplotlib.image.imread(shot)[..., :3]  # (H, W, 3) floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1200)
    non_white = (pixels < 0.94).any(axis=-1).mean()
    colours = np.unique((pixels * 15).round().reshape(-1, 3), axis=0)
    assert non_white > 0.03 and len(colours) > 20, (non_white, len(colours))
    for hex_colour in ("#1f77b4", "#ff7f0e"):  # group's and tree's curves
        rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=-1) < 0.06).sum() > 50, hex_colour


def test_a_30_step_report_is_short_in_the_browser(long_run, tmp_path):
    """Laid out by Chromium, a 30-step run's page is a few screens (it was ~10,500 px), the training rollouts
    start within the first two, and the open step shows a rollout's reward reason."""
    chromium = _chromium(tmp_path)
    page = tmp_path / "measured.html"
    page.write_text(long_run.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]
    dumped = subprocess.run([chromium, *flags, page.resolve().as_uri()], capture_output=True, timeout=120,
                            check=True, text=True).stdout
    (body,) = Dom(dumped).root.find_all("body")
    height, top = int(body.attrs["data-height"]), float(body.attrs["data-rollouts-top"])
    assert height < 4000 and 0 < top < 2500, (height, top)
    last = [g for g in jsonl(long_run.parent / "rollouts.jsonl") if g["step"] == 30]
    assert body.attrs["data-reason-shown"].startswith("arith") and last[0]["rollouts"][0]["reasons"]["arith"] in (
        body.attrs["data-reason-shown"])


def test_cli_report(runs, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(runs["group"]), str(runs["tree"]), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").exists()
    result = runner.invoke(app, ["report", str(tmp_path)])  # not a run directory
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_a_failing_report_never_fails_the_run(runs, monkeypatch, caplog):
    import rollwise.report

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(rollwise.report, "write_report", broken)
    with caplog.at_level(logging.WARNING, logger="rollwise"):
        assert runs["trainer"].write_report() is None
    assert "run report not written: RuntimeError: disk full" in caplog.text


# -- loggers --------------------------------------------------------------------------------
def test_tensorboard_writes_events_only_when_chosen(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed: pip install 'rollwise[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for chosen, run in ((["tensorboard"], tmp_path / "on"), ([], tmp_path / "off")):
        run.mkdir()
        log = MetricsLog(run, report_to=chosen)
        log.log(1, {"reward/mean": 0.5, "eval/accuracy": 0.25})
        log.close()
    assert not (tmp_path / "off" / "tensorboard").exists()
    events = EventAccumulator(str(tmp_path / "on" / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/accuracy", "reward/mean"]  # metrics.jsonl's names
    assert events.Scalars("reward/mean")[0].value == 0.5


def test_wandb_runs_offline_under_the_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed: pip install 'rollwise[wandb]'")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    log = MetricsLog(tmp_path, report_to=["wandb"], config={"optim": {"lr": 1e-4}})
    log.log(1, {"reward/mean": 0.5})
    log.log(2, {"reward/mean": 0.75, "eval/accuracy": 0.25})
    log.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    (data,) = offline.glob("run-*.wandb")
    assert b"reward/mean" in data.read_bytes() and b"eval/accuracy" in data.read_bytes()
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["reward/mean"] == 0.75


def test_report_to_errors_name_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match="unknown logger 'tensorbord'; did you mean 'tensorboard'"):
        load_run_config(None, ["train.report_to=[tensorbord]"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'rollwise\[tensorboard\]'"):
        load_run_config(None, ["train.report_to=[tensorboard]"])
    with pytest.raises(ConfigError, match=r"pip install 'rollwise\[tensorboard\]'"):
        MetricsLog(Path("."), report_to=["tensorboard"])
    assert load_run_config(None, []).train.report_to == []


# -- training rollouts (rollouts.jsonl) -----------------------------------------------------
def test_training_rollouts_are_logged_with_rewards_reasons_and_advantages(runs):
    """Every step logs train.log_rollouts groups (default 2) of the groups it trained on: each rollout's
    text, reward, components with their reasons, and advantage (GRPO: centred within the group)."""
    for run in ("group", "tree"):
        records = jsonl(runs[run] / "rollouts.jsonl")
        assert [r["step"] for r in records] == [1, 1, 2, 2, 3, 3, 4, 4], run
        for rec in records:
            assert rec["prompt"] and rec["every"] == 1 and len(rec["rollouts"]) == 4
            for r in rec["rollouts"]:
                assert isinstance(r["completion"], str) and set(r["components"]) == set(r["reasons"]) == {"arith"}
                assert r["reasons"]["arith"] and isinstance(r["advantage"], float)
            if not rec["zero_signal"]:
                assert abs(sum(r["advantage"] for r in rec["rollouts"])) < 1e-3
            else:
                assert all(r["advantage"] == 0.0 for r in rec["rollouts"])
