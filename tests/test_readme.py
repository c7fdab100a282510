"""The README's snippets do what it says: the trainer example runs as written on the data
the README says how to make, `make demo` prints the README's sample, the kill recipe kills
one trainer of its own job from one shell, `make demo` and `make test` install what the
README says, and every link points at a file in the repository."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_example(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- readme-example: {re.escape(name)} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"README has no example {name}"
    return match.group(1)


def as_run_here(command: str) -> str:
    """A README command line with this interpreter for the venv's (`.venv/bin/...`)."""
    python = shlex.quote(sys.executable)
    spelled = {"paddlecloud": f"{python} -m paddlecloud", "python": python}
    return re.sub(r"(?<![\w/])\.venv/bin/(paddlecloud|python)\b", lambda m: spelled[m.group(1)], command)


def test_readme_trainer_runs_as_written_on_the_data_it_says_how_to_make(tmp_path):
    pytest.importorskip("numpy")  # the data generator's (the paddle extra has it)
    (tmp_path / "count_rows.py").write_text(readme_example("count_rows.py"))
    text = README.read_text()
    data = re.search(r"^(\.venv/bin/python -m examples\.fit_a_line\.data .*)$", text, re.M)
    command = re.search(r"^(\.venv/bin/paddlecloud local train --module count_rows .*)$", text, re.M)
    assert data and command, "README does not show how to make count_rows' data and run it"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    made = subprocess.run(as_run_here(data.group(1)), shell=True, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    lines = sum(len(p.read_text().splitlines()) for p in (tmp_path / "data").glob("*.csv"))
    assert lines == 4000 and "4,000 lines" in text
    result = subprocess.run(as_run_here(command.group(1)) + f" --output {tmp_path / 'out'}", shell=True,
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    per_epoch: dict[int, int] = {}
    for epoch, count in re.findall(r"trainer \d epoch (\d): (\d+) rows", result.stdout):
        per_epoch[int(epoch)] = per_epoch.get(int(epoch), 0) + int(count)
    assert per_epoch == {0: lines, 1: lines}  # nothing lost, nothing read twice
    for zero in re.findall(r"^trainer \d epoch \d: 0 rows.*$", result.stdout, re.M):
        assert zero.endswith("(the other trainers read this epoch's tasks)")


def sample_pattern(line: str) -> re.Pattern[str]:
    """A README sample line as a pattern: numbers stand for any number, `…` for anything."""
    parts = []
    for piece in re.split(r"(…|\d+)", line):
        parts.append(".*" if piece == "…" else r"\d+" if piece.isdigit() else re.escape(piece))
    return re.compile("".join(parts))


def in_order(samples: list[str], output: list[str]) -> list[str]:
    """The sample lines that do not match output lines in the sample's order ([] when all do)."""
    at, missing = 0, []
    for sample in samples:
        pattern = sample_pattern(sample)
        found = next((i for i in range(at, len(output)) if pattern.fullmatch(output[i])), None)
        if found is None:
            missing.append(sample)
        else:
            at = found + 1
    return missing


def test_sample_lines_match_in_order():
    output = ["a 1", "[x] epoch 12 loss 0.5 (data in /tmp/q-abc)", "b", "done 4/4"]
    assert in_order(["[x] epoch 3 loss 0.25 (data in /tmp/q-…)", "done 1/1"], output) == []
    assert in_order(["done 1/1", "a 1"], output) == ["a 1"]
    assert in_order(["[x] epoch 3 loss 0.25 (data in /tmp/r-…)"], output) != []


@pytest.mark.paddle
@pytest.mark.timeout(400)
def test_readme_demo_sample_is_what_make_demo_prints(tmp_path):
    """`make demo`'s command, as the README gives it, run here: the README's sample lines come
    in its output in order, and nothing else of the quiet first demo's noise."""
    pytest.importorskip("paddle")
    text = README.read_text()
    command = re.search(r"runs `(\.venv/bin/paddlecloud local train --example fit-a-line [^`]+)`",
                        " ".join(text.split()))
    assert command, "README does not say what make demo runs"
    assert command.group(1).split()[1:] == MAKEFILE_DEMO.split()[1:]
    sample = re.search(r"<!-- readme-sample: make demo -->\n```\n(.*?)```", text, re.S).group(1).splitlines()
    etcd = shutil.which("etcd")
    if etcd != "/usr/bin/etcd":  # the README shows Debian's
        sample = [line.replace("(/usr/bin/etcd)", f"({etcd})") for line in sample]
    result = subprocess.run(as_run_here(command.group(1)), shell=True, cwd=tmp_path, capture_output=True,
                            text=True, timeout=380,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = (result.stderr + result.stdout).splitlines()
    assert in_order(sample[:1], output) == []  # said on stderr, before the job's lines
    assert in_order(sample[1:], result.stdout.splitlines()) == [], result.stdout[-5000:]
    assert sample_pattern(sample[-1]).fullmatch(result.stdout.splitlines()[-1])  # how it ended, last
    for noise in ("INSECURE", "Modified FLAGS", "WARNING", "Traceback"):
        assert noise not in result.stdout, noise


MAKEFILE_DEMO = re.search(r"^\t\$\(BIN\)/(paddlecloud local train --example .*)$",
                          (ROOT / "Makefile").read_text(), re.M).group(1)


def test_make_demo_installs_the_paddle_extra_only_and_make_test_is_ci():
    demo = subprocess.run(["make", "-n", "demo", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert "pip install -q -e '.[paddle]'" in demo and "[test" not in demo
    assert 'PYTHONWARNINGS="ignore:Editable installation"' in demo  # no setuptools warning
    test = subprocess.run(["make", "-n", "test", "VENV=/nonexistent-venv", "CHECKOV_VENV=/nonexistent-checkov"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "pip install -q -e '.[test,paddle]'" in test
    assert '/nonexistent-checkov/bin/pip install -q "checkov==' in test  # the checkov test runs
    assert "ruff check ." in test and "pytest -n 2" in test
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "make test" and "pip install" not in ci
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("zstandard") for d in extras["zstd"]) and "zstd" in extras["test"][0]


@pytest.mark.paddle
@pytest.mark.timeout(400)
def test_readme_kill_recipe_kills_one_trainer_of_its_own_job_only(tmp_path):
    """The recipe as written, from one shell, beside a decoy whose command line matches the
    recipe's pattern (another job's trainer): the decoy lives, the job restarts its group
    once and succeeds, and the console shows no C++ abort report."""
    pytest.importorskip("paddle")
    recipe = re.search(r"<!-- readme-recipe: kill -->\n```sh\n(.*?)```", README.read_text(), re.S)
    assert recipe, "README has no kill recipe"
    decoy = subprocess.Popen(["bash", "-c", "exec -a 'python -m examples.fit_a_line.train' sleep 300"])
    shell = subprocess.Popen(["bash", "-c", "set -u\n" + as_run_here(recipe.group(1))], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    try:
        shown, _ = shell.communicate(timeout=380)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGTERM)  # the job's supervisor stops its children
            shell.wait(timeout=60)
        alive = decoy.poll() is None
        decoy.kill()
        decoy.wait()
    assert alive, "the recipe killed another job's trainer"
    assert shell.returncode == 0, shown
    console = (tmp_path / "kill-demo.log").read_text()
    assert console.count("restarting the trainer group") == 1, console[-3000:]
    assert re.search(r"^\[local\] trainer \d died(, and trainer \d aborted without its gloo peer)?: "
                     r"restarting the trainer group$", shown, re.M), shown
    assert "resumed from the checkpoint of epoch" in shown
    assert "job fit-a-line succeeded" in console
    assert "terminate called" not in console and "gloo::IoException" not in console
    # a peer's gloo abort is its own abort(), told as the death's consequence, never a kill
    assert "killed by SIGABRT" not in console, console[-3000:]


PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_links_point_at_files_in_the_repository(page):
    path = ROOT / page
    links = re.findall(r"\]\(([^)#\s]+)", path.read_text())
    local = [link for link in links if "://" not in link]
    if page in ("README.md", "docs/design.md"):
        assert local, f"{page} links nothing"
    missing = [link for link in local if not (path.parent / link).resolve().exists()]
    assert not missing, f"{page} links files that are not in the repository: {missing}"
    assert all((path.parent / link).resolve().is_relative_to(ROOT) for link in local)


def test_the_readme_is_a_landing_page_that_leads_to_every_docs_page():
    """At most 300 lines (what it is, the two commands, the first job, where to go next); the
    rest lives in docs/ by task, each page reachable from the README."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    for heading in ("## Two commands", "## Your first job", "## Where to go next"):
        assert f"\n{heading}\n" in text, heading
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not lead to: {sorted(pages - linked)}"
