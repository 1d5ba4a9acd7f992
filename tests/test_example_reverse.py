"""The README's bring-your-own block runs as written: its command trains ``examples/reverse`` (a
JSONL file and a TRL reward module beside the recipe, no PYTHONPATH) from the repository's root, and
the YAML it shows is the example recipe's."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _block() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("**Bring your own model, data and reward.**")
    return readme[start:readme.index("\n## ", start)]


def readme_command() -> list[str]:
    """The arguments after ``rollwise`` of the bring-your-own block's command."""
    bash = re.search(r"```bash\n(.*?)```", _block(), re.S).group(1)
    line = next(line for line in bash.splitlines() if line.startswith(".venv/bin/rollwise "))
    return shlex.split(line, comments=True)[1:]


def _contains(big, small) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(big) == len(small) and all(map(_contains, big, small))
    return big == small


def test_the_readme_shows_the_example_recipe():
    args = readme_command()
    assert args[:2] == ["train", "examples/reverse/recipe.yaml"]
    shown = yaml.safe_load(re.search(r"```yaml\n(.*?)```", _block(), re.S).group(1))
    recipe = yaml.safe_load((ROOT / args[1]).read_text())
    assert shown["task"]["name"] == "file" and _contains(recipe, shown)


def test_the_readme_command_runs(tmp_path):
    """Run from the repository's root in a fresh process, as a user would, shortened to 1 RL step."""
    rollwise = Path(sys.executable).with_name("rollwise")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # no bytecode written beside the example
    shorter = ["--set", f"output_dir={tmp_path}", "--set", "sft.steps=2", "--set", "train.steps=1",
               "--set", "model.threads=1", "--set", "train.eval_samples=0"]
    done = subprocess.run([str(rollwise), *readme_command(), *shorter], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run = tmp_path / "reverse"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_judge"] == "reversed_correctly" and summary["reward_failures"] == {}
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/reversed_correctly" in m and "reward/format_reward" in m for m in metrics)
    assert len((run / "sft.jsonl").read_text().splitlines()) == 2
