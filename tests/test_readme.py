"""The README's snippets do what it says: the trainer example runs as written through the
README's own command, the kill recipe hits a trainer and not its launcher, and every link
points at a file in the repository."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import write_records
from local_runs import LocalRun
from processes import find, job_processes
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


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


def test_readme_kill_recipe_matches_the_trainers_and_not_their_launchers(tmp_path, job_name):
    """The recipe's pattern, with the stub's module for fit-a-line's, run through pgrep against
    a real local job: it must match both trainer processes and neither launcher. Only this
    job's processes are looked at and killed (others may run the same module meanwhile)."""
    recipe = re.search(r"^pgrep -of '([^']+)' \| xargs kill -9$", README.read_text(), re.M)
    assert recipe, "README has no kill recipe"
    module = "examples[.]fit_a_line[.]train"
    assert module in recipe.group(1)
    pattern = recipe.group(1).replace(module, "trainer_agent[.]stub")
    write_records(tmp_path / "data", files=4, records_per_file=150)
    run = LocalRun(tmp_path, job_name, "--module", "trainer_agent.stub", "--input", str(tmp_path / "data"),
                   "--trainers", "2", "--", "--delay", "0.02")
    try:
        trainers = wait_until(lambda: len(find(job_name, module="trainer_agent.stub")) == 2
                              and find(job_name, module="trainer_agent.stub"),
                              message="two stub trainers running", details=run.text)
        launchers = [pid for pid, argv, _ in job_processes(job_name) if argv[1:4] == ["-m", "paddlecloud", "trainer"]]
        assert len(launchers) == 2
        matched = {int(pid) for pid in subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                                                      text=True, check=True).stdout.split()}
        assert set(trainers) <= matched, (trainers, matched)
        assert not set(launchers) & matched, (launchers, matched)
        os.kill(min(trainers), signal.SIGKILL)
        assert run.wait() == 0, run.text()[-3000:]
        assert "died: restarting the trainer group" in run.text()
    finally:
        run.stop()


@pytest.mark.parametrize("page", ["README.md", "docs/design.md"])
def test_links_point_at_files_in_the_repository(page):
    path = ROOT / page
    links = re.findall(r"\]\(([^)#\s]+)", path.read_text())
    local = [link for link in links if "://" not in link]
    assert local, f"{page} links nothing"
    missing = [link for link in local if not (path.parent / link).resolve().exists()]
    assert not missing, f"{page} links files that are not in the repository: {missing}"
    assert all((path.parent / link).resolve().is_relative_to(ROOT) for link in local)
