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
        f.write(json.dumps({"step": 4, "prompt": "6*7=", "completion": "x", "reward": 1.0, "reasons": {}, "answer": "42",
                            "messages": EPISODE}) + "\n")
    tree = jsonl(hostile / "trees.jsonl")[-1]
    tree["nodes"][-1]["text"] = HOSTILE
    tree["leaves"][0] |= {"correct": True, "reward": 1.0}
    with (hostile / "trees.jsonl").open("a") as f:
        f.write(json.dumps(tree) + "\n")
    return {"root": root, "group": root / "group", "tree": root / "tree", "hostile": hostile,
            "trainer": trainer, "tree_report": tree_report}


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


def test_every_section_of_one_run(runs):
    dom = parse(runs["tree"] / "report.html")
    for id_ in ("summary", "curves", "config-diff", "samples", "trees"):
        dom.by_id(id_)
    summary = json.loads((runs["tree"] / "summary.json").read_text())
    row = dom.by_id("summary").find_all("tr", data_run="tree")[0]
    assert row.find_all("td", cls="accuracy")[0].text() == (
        f"{summary['initial_accuracy']:.1%} → {summary['final_accuracy']:.1%}")
    assert f"{summary['generated_tokens']:,}" in row.text() and "arith" in row.text() and "grpo" in row.text()
    assert "nothing to compare" in dom.by_id("config-diff").text()
    assert not parse(runs["group"] / "report.html").find_all(id="trees")  # no tree strategy, no tree section


def test_curves_plot_every_logged_metric_once(runs):
    dom = parse(runs["tree"] / "report.html")
    figures = dom.by_id("curves").find_all("figure")
    plotted = [m for f in figures for m in f.attrs["data-metrics"].split()]
    logged = {k for m in jsonl(runs["tree"] / "metrics.jsonl") for k, v in m.items()
              if k != "step" and isinstance(v, float)}
    assert sorted(plotted) == sorted(logged)  # each logged metric once; nothing not logged
    ids = {f.attrs["id"] for f in figures}
    assert {"curves-reward", "curves-eval", "curves-length", "curves-time", "curves-strategy"} <= ids
    assert "tree/forks" in dom.by_id("curves-strategy").attrs["data-metrics"].split()
    assert "eval/pass@2" in dom.by_id("curves-eval").attrs["data-metrics"].split()
    for f in figures:
        (img,) = f.find_all("img")
        prefix = "data:image/png;base64,"
        assert img.attrs["src"].startswith(prefix)
        png = base64.b64decode(img.attrs["src"][len(prefix):])
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000


def test_two_runs_overlaid_with_their_config_diff(runs, both):
    _, dom = both
    keys = {tr.attrs["data-key"] for tr in dom.by_id("config-diff").find_all("tr") if "data-key" in tr.attrs}
    assert keys == {"name", "rollout.strategy", "optim.lr"}
    row = dom.by_id("config-diff").find_all("tr", data_key="rollout.strategy")[0]
    assert [td.text() for td in row.find_all("td")] == ["rollout.strategy", "group", "tree"]
    assert len(dom.by_id("summary").find_all("tr")) == 3  # header + one row per run
    # tree/* was logged by one run only: it is plotted, the other run simply has no line there
    assert "tree/forks" in dom.by_id("curves-strategy").attrs["data-metrics"].split()


def test_viewer_holds_every_eval_sample_with_its_reason(runs, both):
    _, dom = both
    shown = dom.by_id("samples").find_all("div", cls="sample")
    logged = jsonl(runs["group"] / "samples.jsonl") + jsonl(runs["tree"] / "samples.jsonl")
    assert len(shown) == len(logged) == 2 * 3 * 8  # 2 runs, evals at steps 0, 2, 4, 8 prompts each
    for div, s in zip(shown, logged):
        assert div.find_all("pre", cls="completion")[0].text() == s["completion"]
        assert div.find_all("pre", cls="prompt")[0].text() == s["prompt"]
        assert all(reason in div.find_all("div", cls="reasons")[0].text() for reason in s["reasons"].values())
        assert div.attrs["data-correct"] == ("true" if s["reward"] > 0.5 else "false")
        assert ("correct" in div.classes()) == (s["reward"] > 0.5)
    assert "hidden" in dom.by_id("sample-filter").attrs  # shown by the script only: with scripts off, all samples
    assert {b.attrs["data-show"] for b in dom.by_id("sample-filter").find_all("button")} == {"all", "true", "false"}


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
    (script,) = dom.find_all("script")  # the page's own filter, nothing from the run
    assert "sample-filter" in script.text()
    assert not [el for el in dom.find_all() if "onerror" in el.attrs]
    assert len(dom.find_all("img")) == len(dom.by_id("curves").find_all("img"))
    completions = [pre.text() for pre in dom.by_id("samples").find_all("pre", cls="completion")]
    assert completions[-1] == HOSTILE  # shown as the characters the model wrote
    # a multi-turn episode is shown as its conversation: turns and tool results in order, escaped
    (conversation,) = dom.by_id("samples").find_all("div", cls="conversation")
    turns = conversation.find_all("div", cls="turn")
    assert [t.find_all("span", cls="role")[0].text() for t in turns] == ["assistant", "tool calculate", "assistant"]
    assert [t.find_all("pre")[0].text() for t in turns] == [m["content"] for m in EPISODE]
    assert any(code.text() == HOSTILE for code in dom.by_id("trees").find_all("code"))
    raw = out.read_text()
    assert "<script>alert" not in raw and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in raw


def test_report_in_a_headless_browser(runs, both, tmp_path):
    """Debian's Chromium renders the page: the screenshot shows text, tables and both runs' curve colours."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (`make install` installs it with apt-get when run as root)")
    import matplotlib.image

    out, _ = both
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000"]
    subprocess.run([chromium, *flags, out.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    pixels = matplotlib.image.imread(shot)[..., :3]  # (H, W, 3) floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1200)
    non_white = (pixels < 0.94).any(axis=-1).mean()
    colours = np.unique((pixels * 15).round().reshape(-1, 3), axis=0)
    assert non_white > 0.03 and len(colours) > 20, (non_white, len(colours))
    for hex_colour in ("#1f77b4", "#ff7f0e"):  # group's and tree's curves (markers are solid)
        rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=-1) < 0.06).sum() > 50, hex_colour


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


def test_metrics_go_to_their_groups():
    from rollwise.report.plots import group_metrics

    grouped = group_metrics(["kl", "kl_prox", "reward/mean", "dist/workers", "time/weight_sync", "staleness/max", "zzz"])
    assert grouped == {"reward": ["reward/mean"], "kl": ["kl", "kl_prox"], "strategy": ["staleness/max"],
                       "dist": ["dist/workers"], "time": ["time/weight_sync"], "other": ["zzz"]}


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


def _group(i: int, rewards: list[float], text: str = "x", messages=None):
    from rollwise.types import Prompt, Rollout, RolloutGroup

    rollouts = [Rollout(f"p{i}", [1], [2], [0.0], [0], "stop", completion_text=text, reward=r, score=r,
                        reward_components={"f": r}, reward_reasons={"f": f"why {r}"}, advantage=[r - 0.5],
                        messages=messages) for r in rewards]
    return RolloutGroup(Prompt(f"p{i}", f"prompt {i}", answer="a"), rollouts)


def test_rollout_log_picks_groups_that_trained_first_and_logs_episodes(tmp_path):
    from rollwise.train.rollout_log import RolloutLog

    log = RolloutLog(tmp_path, groups_per_step=2)
    episode = [{"role": "assistant", "content": "<tool_call>{}</tool_call>"}, {"role": "tool", "name": "calc",
                                                                           "content": "42"}]
    log.log(1, [_group(0, [1.0, 1.0]), _group(1, [0.0, 1.0], messages=episode), _group(2, [1.0, 0.0])])
    records = jsonl(tmp_path / "rollouts.jsonl")
    assert [r["prompt_id"] for r in records] == ["p1", "p2"]  # spread first, in sampled order
    assert records[0]["rollouts"][0]["messages"] == episode and "messages" not in records[1]["rollouts"][0]
    assert records[0]["rollouts"][1] | {} == {
        "completion": "x", "reward": 1.0, "score": 1.0, "components": {"f": 1.0}, "reasons": {"f": "why 1.0"},
        "advantage": 0.5, "tokens": 1, "finish_reason": "stop", "correct": True, "messages": episode}
    assert RolloutLog(tmp_path, groups_per_step=0) and not jsonl(tmp_path / "rollouts.jsonl")  # fresh run: empty


def test_rollout_log_stays_within_its_budget_and_resumes(tmp_path):
    """Past train.rollouts_mb every other logged step is dropped and the stride doubles: an even sample of
    the whole run in a bounded file; a resumed log drops lines after the checkpoint and keeps the stride."""
    from rollwise.train.rollout_log import TEXT_CHARS, RolloutLog

    budget_mb = 0.05  # ~52 KB; each step ~ 2 groups x 2 rollouts x ~4 KB
    log = RolloutLog(tmp_path, groups_per_step=2, budget_mb=budget_mb)
    for step in range(1, 41):
        log.log(step, [_group(0, [0.0, 1.0], "y" * 9000), _group(1, [1.0, 0.0], "z" * 9000)])
        assert (tmp_path / "rollouts.jsonl").stat().st_size <= budget_mb * 1024 * 1024
    records = jsonl(tmp_path / "rollouts.jsonl")
    steps = sorted({r["step"] for r in records})
    every = log.every
    assert every > 1 and all(r["every"] == every for r in records)
    assert steps == list(range(every, 41, every)) and len(steps) >= 2  # first to last, evenly
    text = records[0]["rollouts"][0]["completion"]
    assert text.startswith("y" * TEXT_CHARS) and text.endswith("[5,000 more characters not logged]")
    resumed = RolloutLog(tmp_path, groups_per_step=2, budget_mb=budget_mb, resume_from_step=steps[1])
    assert resumed.every == every and [r["step"] for r in jsonl(tmp_path / "rollouts.jsonl")] == [steps[0]] * 2 + [
        steps[1]] * 2
