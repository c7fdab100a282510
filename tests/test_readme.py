"""The README's trainer example runs as written, through the README's own command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from datasets import write_records

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- readme-example: {re.escape(name)} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"README has no example {name}"
    return match.group(1)


def test_readme_trainer_runs_as_written(tmp_path):
    (tmp_path / "count_rows.py").write_text(readme_example("count_rows.py"))
    write_records(tmp_path / "data", files=3, records_per_file=7)
    command = re.search(r"^(paddlecloud local train --module count_rows .*)$", README.read_text(), re.M)
    assert command, "README does not show how to run count_rows"
    args = command.group(1).split()[1:]  # the README's own flags, quotes dropped
    args = [a.strip("'") for a in args]
    result = subprocess.run([sys.executable, "-m", "paddlecloud", *args, "--output", str(tmp_path / "out")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {int(n) for n in re.findall(r"trainer \d epoch (\d): \d+ rows", result.stdout)}
    assert rows == {0, 1}
    per_epoch = {}
    for epoch, count in re.findall(r"trainer \d epoch (\d): (\d+) rows", result.stdout):
        per_epoch[int(epoch)] = per_epoch.get(int(epoch), 0) + int(count)
    assert per_epoch == {0: 21, 1: 21}
