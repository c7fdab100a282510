"""`paddlecloud local train` refuses what a new user gets wrong before anything starts.

Each case runs the real CLI as a child process with its own TMPDIR (where a private
etcd would put its data directory) and asserts: exit code 2, one error naming the bad
value, no traceback, no etcd data directory, no logs and no process of the job.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import write_records
from processes import job_processes

STUB = "trainer_agent.stub"


def run_cli(tmp_path: Path, args: str) -> subprocess.CompletedProcess:
    """The CLI run through a shell in `tmp_path`, as a user types `args` (globs expand)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    command = (f"{shlex.quote(sys.executable)} -m paddlecloud local train --output out "
               f"--module {STUB} {args}")
    return subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TMPDIR=str(tmpdir)))


def assert_refused_before_starting(tmp_path: Path, job: str, result: subprocess.CompletedProcess,
                                   fragment: str) -> None:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "etcd started" not in result.stdout + result.stderr
    assert list((tmp_path / "tmpdir").iterdir()) == []  # no private etcd's data directory
    assert not (tmp_path / "out" / "logs").exists()
    assert job_processes(job) == []


@pytest.mark.parametrize("args, fragment", [
    # The shell expands the glob: only part-00000 would be the input, the rest module arguments.
    ("--input data/*.csv", "'data/part-00001.csv' (and 1 more) came after --input 'data/part-00000.csv': "
                           "the shell expanded an unquoted glob"),
    ("--input data/*.csv -- --delay 0.01", "quote the glob, e.g. --input 'data/*.csv'"),
    ("--input 'data/*.csv' extra", "unexpected argument 'extra': arguments for the module go after '--'"),
    ("extra --input 'data/*.csv' -- --delay 0.01", "unexpected argument 'extra'"),
], ids=["unquoted-glob", "unquoted-glob-with-module-args", "argument-at-the-end", "argument-before-dashes"])
def test_leftover_arguments_without_dashes_are_refused(tmp_path, job_name, args, fragment):
    write_records(tmp_path / "data", files=3, records_per_file=2)
    result = run_cli(tmp_path, f"--job {job_name} {args}")
    assert_refused_before_starting(tmp_path, job_name, result, fragment)


@pytest.mark.parametrize("args, fragment", [
    ("--example fit-a-line --input 'data/*.csv'", "--example fit-a-line brings its own module and data: "
                                                  "drop --module and --input"),
    ("--input 'data/*.csv' --session-ttl abc", "invalid duration 'abc'"),
    ("--input 'data/*.csv' --session-ttl 1s", "--session-ttl 1s is too short"),
    ("--input 'data/*.csv' --format parquet", "'parquet' is not one of 'lines'"),
    ("--input 'data/*.csv' --job a/b", "invalid job name 'a/b'"),
    ("--input 'data/*.csv' --job ''", "invalid job name ''"),
    ("--input 'data/*.csv' --output /proc/x", "cannot write in '/proc/x'"),
    ("--input 'data/*.csv' --output /proc", "cannot write in '/proc'"),
    ("--input 'data/*.csv' -e NOEQUALS", "'NOEQUALS' is not KEY=VALUE"),
    ("--input 'data/*.csv' -e =x", "'=x' is not KEY=VALUE"),
], ids=["example-with-module-and-input", "session-ttl-abc", "session-ttl-too-short", "format-parquet",
        "job-with-slash", "job-empty", "output-uncreatable", "output-unwritable", "env-without-equals", "env-without-key"])
def test_a_bad_flag_is_one_error_naming_the_value_and_starts_nothing(tmp_path, job_name, args, fragment):
    write_records(tmp_path / "data", files=2, records_per_file=2)
    named = "--job" in args
    result = run_cli(tmp_path, args if named else f"--job {job_name} {args}")
    assert_refused_before_starting(tmp_path, job_name, result, fragment)


def test_example_refuses_package_path_beside_it(tmp_path, job_name):
    result = run_cli(tmp_path, f"--job {job_name} --example fit-a-line --package-path .")
    assert_refused_before_starting(tmp_path, job_name, result, "drop --module and --package-path")
    assert not (tmp_path / "out" / "data").exists()  # the example's data was not generated


def test_a_finished_job_run_again_without_fresh_says_it_is_complete_and_starts_nothing(tmp_path, job_name):
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    write_records(tmp_path / "data", files=1, records_per_file=2)
    # what the trainers of a job of epochs 0..1 leave behind: the checkpoint of epoch 1's end
    save_checkpoint(str(tmp_path / "out" / "checkpoints"), {"w": 1}, TrainStatus(1))
    result = run_cli(tmp_path, f"--job {job_name} --input 'data/*.csv' --epochs 2")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"job {job_name} is complete" in result.stdout
    assert "epochs are 0..1" in result.stdout and "with --fresh" in result.stdout
    assert "resuming" not in result.stdout + result.stderr
    assert list((tmp_path / "tmpdir").iterdir()) == []  # no private etcd was started
    assert not (tmp_path / "out" / "logs").exists()
    assert job_processes(job_name) == []


def test_the_seeds_package_folder_runs_as_the_modules_top_package(tmp_path, job_name):
    # seed 002: paddle local train --package-path=./demo --module=demo.train --input=... --output=...
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "train.py").write_text("from demo import dataset\nprint('trained', dataset.NAME)\n")
    (tmp_path / "demo" / "dataset.py").write_text("NAME = 'on demo'\n")
    write_records(tmp_path / "data", files=1, records_per_file=2)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    result = subprocess.run(  # the console script, as a user types it (`python -m` would put . on the path)
        [str(Path(sys.executable).parent / "paddlecloud"), "local", "train", "--package-path=./demo",
         "--module=demo.train", "--input=data", "--output=out", f"--job={job_name}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "logs").rglob("*") if p.is_file())
    assert "trained on demo" in logs


def test_a_module_the_package_does_not_hold_is_refused_before_anything_starts(tmp_path, job_name):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "train.py").write_text("print('trained')\n")
    write_records(tmp_path / "data", files=1, records_per_file=2)
    # run_cli gives --module first: the later one wins, as click takes the last
    missing = run_cli(tmp_path, f"--job {job_name} --package-path=./demo --module=demo.nope --input=data")
    assert_refused_before_starting(tmp_path, job_name, missing, "module 'demo.nope' is not in --package-path")


def test_a_package_path_without_a_module_runs_its_train_py_or_says_it_has_none(tmp_path):
    from click.testing import CliRunner

    from paddlecloud.cli.local import local

    (tmp_path / "quick_start").mkdir()
    (tmp_path / "quick_start" / "dataset.py").write_text("")
    result = CliRunner().invoke(local, ["train", f"--package-path={tmp_path / 'quick_start'}",
                                        f"--input={tmp_path}", f"--output={tmp_path / 'out'}"])
    assert result.exit_code == 2, result.output
    assert "holds neither train.py nor trainer.py at its root" in result.output
