"""Exact resume mid-epoch, for real: fit-a-line resized 2 -> 1 -> 2 and a trainer SIGKILLed.

The example logs the record ids of every step its model took and the step of every
checkpoint it resumed from; the model's lineage is that log with the steps undone by
each restart (those after the checkpoint resumed from) dropped. Through every restart,
each epoch's records must be in it exactly once (`chaos.lineage`, shared with the chaos
harness's collective runs).
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from chaos.lineage import lineage, record_ids
from local_runs import LocalRun
from masters import wait_until
from processes import find

pytest.importorskip("paddle")
pytestmark = pytest.mark.paddle

EXAMPLE = "examples.fit_a_line.train"


def resumes(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if '"resumed"' in line)


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
                      "--resize-schedule", "2@0s,1@12s,2@24s", "--etcd-endpoints", etcd_endpoint,
                      "-e", f"FIT_A_LINE_CONSUMED_LOG={log}", "--", "--step-delay", "0.03")
    # 2 -> 1 -> 2: two group restarts, each resuming from a checkpoint
    wait_until(lambda: "scaling the trainers 1 -> 2" in run.text() and log.exists()
               and resumes(log) >= 3, timeout=300, message="the resize to 2 never resumed")
    marks = len(log.read_text().splitlines())
    wait_until(lambda: len(log.read_text().splitlines()) > marks + 20, timeout=120,
               message="the group of 2 never stepped")
    victim = find(job_name, module=EXAMPLE, PADDLE_TRAINER_ID="1")
    assert victim, "trainer 1 is not running"
    os.kill(victim[0], signal.SIGKILL)
    assert run.wait(timeout=300) == 0, run.text()[-4000:]
    text = run.text()
    assert "scaling the trainers 2 -> 1" in text
    assert "restarting the trainer group" in text
    assert "resumed from the checkpoint inside epoch" in text  # a mid-epoch resume happened
    expected = record_ids(run.output / "data")
    assert len(expected) > 10_000 and set(expected.values()) == {1}
    consumed = lineage(log)
    assert sorted(consumed) == [0, 1, 2]
    for epoch, ids in consumed.items():
        extra, missing = ids - expected, expected - ids
        assert not extra and not missing, (f"epoch {epoch}: {sum(extra.values())} records twice "
                                           f"or unknown, {sum(missing.values())} never consumed")
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
