"""Exact resume mid-epoch, for real: fit-a-line scaled 2 -> 1 -> 2 and a trainer SIGKILLed.

The example logs the record ids of every step its model took and the step of every
checkpoint it resumed from; the model's lineage is that log with the steps undone by
each restart (those after the checkpoint resumed from) dropped. Through every restart,
each epoch's records must be in it exactly once (`chaos.lineage`, shared with the chaos
harness's collective runs).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from chaos.lineage import lineage, off_by_epoch, record_ids
from local_runs import LocalRun, leader_of
from masters import wait_until
from processes import find

from examples.fit_a_line.consumed import read_entries

pytest.importorskip("paddle")
pytestmark = pytest.mark.paddle

EXAMPLE = "examples.fit_a_line.train"




def resumes(log: Path) -> int:
    return sum(1 for entry in read_entries(log) if "resumed" in entry)


def early_in_an_epoch(log: Path, after: int) -> bool:
    """The latest checkpoint, saved after the log's first ``after`` entries, lies early inside
    an epoch: many tasks before the epoch's end checkpoint, so a restart now resumes inside."""
    saved = [entry for entry in read_entries(log)[after:] if "saved" in entry]
    return bool(saved) and saved[-1]["tasks_done"] is not None and saved[-1]["tasks_done"] <= 18


@pytest.fixture
def run_example(tmp_path, job_name):
    runs: list[LocalRun] = []

    def start(*args: str) -> LocalRun:
        run = LocalRun(tmp_path, job_name, "--example", "fit-a-line", *args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


@pytest.mark.timeout(420)
def test_resized_and_killed_the_model_consumes_every_record_once_per_epoch(
        run_example, tmp_path, job_name, etcd_endpoint):
    log = tmp_path / "consumed.jsonl"
    run = run_example("--epochs", "3", "--chunk-bytes", "64KiB", "--checkpoint-every", "6",
                      "--trainers", "2", "--min-trainers", "1", "--max-trainers", "2",
                      "--etcd-endpoints", etcd_endpoint, "-e", f"FIT_A_LINE_CONSUMED_LOG={log}",
                      "--", "--step-delay", "0.03")
    wait_until(lambda: asyncio.run(leader_of(etcd_endpoint, job_name)), timeout=60, message="no leader")
    address = asyncio.run(leader_of(etcd_endpoint, job_name))
    # Each change comes early inside an epoch (not on a clock, which a loaded machine
    # outruns), so that each group restart resumes from a checkpoint inside it.
    for size, resumed in ((1, 1), (2, 3)):
        marks = len(read_entries(log))
        wait_until(lambda marks=marks: early_in_an_epoch(log, marks), timeout=180,
                   message=f"no checkpoint early inside an epoch before the resize to {size}")
        done = run.scale(address, size)
        assert done.returncode == 0, done.stderr
        wait_until(lambda resumed=resumed: resumes(log) >= resumed, timeout=180,
                   message=f"the group of {size} never resumed")
    marks = len(read_entries(log))
    wait_until(lambda: early_in_an_epoch(log, marks), timeout=180,
               message="the group of 2 saved no checkpoint early inside an epoch")
    victim = find(job_name, module=EXAMPLE, PADDLE_TRAINER_ID="1")
    assert victim, "trainer 1 is not running"
    os.kill(victim[0], signal.SIGKILL)
    assert run.wait(timeout=300) == 0, run.text()[-4000:]
    text = run.text()
    assert "scaling the trainers 2 -> 1" in text and "scaling the trainers 1 -> 2" in text
    assert "restarting the trainer group" in text
    # every restart (two resizes, one death) resumed inside an epoch
    assert text.count("resumed from the checkpoint inside epoch") >= 5, text[-4000:]
    expected = record_ids(run.output / "data")
    assert len(expected) > 10_000 and set(expected.values()) == {1}
    assert sorted(lineage(log)) == [0, 1, 2]
    assert off_by_epoch(log, run.output / "data") == {}
    losses = {int(e): float(v) for e, v in re.findall(r"\[trainer 0\] epoch (\d+) loss ([0-9.]+)", text)}
    assert sorted(losses) == [0, 1, 2]
    assert losses[2] < losses[1] < losses[0]


def test_the_lineage_drops_the_steps_a_restart_undid(tmp_path):
    log = tmp_path / "log.jsonl"
    entries = [{"step": 1, "rank": 0, "epoch": 0, "ids": [1, 2]},
               {"step": 2, "rank": 0, "epoch": 0, "ids": [3]},   # undone by the resume at 1
               {"resumed": 1, "rank": 0},
               {"step": 2, "rank": 0, "epoch": 0, "ids": [3, 4]}]
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert lineage(log) == {0: Counter({1: 1, 2: 1, 3: 1, 4: 1})}


def test_a_line_still_being_appended_is_not_read(tmp_path):
    """Trainers append to the log while the benchmarks and the tests read it: a read may catch
    a line halfway (it broke bench/elastic.py's smoke test once)."""
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1, "epoch": 0, "ids": [1]}) + "\n" + '{"step": 2, "epo')
    assert read_entries(log) == [{"step": 1, "epoch": 0, "ids": [1]}]
    assert read_entries(tmp_path / "not-yet.jsonl") == []
