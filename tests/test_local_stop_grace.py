"""A trainer that ignores SIGTERM does not hold up a local job: when its group stops (a
scale-down of a collective job restarts the group) it is SIGKILLed after the stop grace,
and the group goes on at the new size; at the job's end the clean-up does the same.

The trainer is a tiny program (the model is not the point): it notes each SIGTERM it
ignores in its own marker file, so a trainer that is gone although it noted the SIGTERM
was killed by something it could not ignore."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from datasets import write_records
from local_runs import leader_of
from processes import gone, job_processes
from waiting import wait_until

IGNORING = '''
import os, signal, sys
from pathlib import Path

marker = Path(sys.argv[1]) / f"trainer-{os.environ['PADDLE_TRAINER_ID']}-{os.getpid()}"

def ignore(signum, frame):
    with open(marker, "a") as out:
        out.write("SIGTERM ignored\\n")

signal.signal(signal.SIGTERM, ignore)
marker.write_text("")  # only once SIGTERM is handled
while True:
    signal.pause()
'''


def _trainers(marks: Path) -> dict[int, Path]:
    return {int(m.name.rsplit("-", 1)[1]): m for m in marks.iterdir()}


def test_a_trainer_ignoring_sigterm_is_killed_when_its_group_stops(tmp_path, local_run, job_name,
                                                                  etcd_endpoint):
    package, marks = tmp_path / "pkg", tmp_path / "marks"
    package.mkdir()
    marks.mkdir()
    (package / "ignoring_trainer.py").write_text(IGNORING)
    write_records(tmp_path / "data", files=2, records_per_file=10)
    run = local_run("--module", "ignoring_trainer", "--package-path", str(package),
                    "--input", str(tmp_path / "data"), "--trainers", "2", "--min-trainers", "1",
                    "--max-trainers", "2", "--etcd-endpoints", etcd_endpoint, "--", str(marks))
    first = wait_until(lambda: len(_trainers(marks)) == 2 and _trainers(marks), timeout=90,
                       message="the two trainers never started", details=run.text)
    address = wait_until(lambda: asyncio.run(leader_of(etcd_endpoint, job_name)), timeout=30,
                         message="no leader")

    scaled = run.scale(address, 1)  # collective: the group stops and starts again at 1
    assert scaled.returncode == 0, scaled.stderr
    # the point is that they do not hang forever: a resize gives the drain's grace (25 s), no more
    wait_until(lambda: all(gone(pid) for pid in first), timeout=60,
               message="a trainer ignoring SIGTERM outlived its group's stop", details=run.text)
    for pid, marker in first.items():
        assert "SIGTERM ignored" in marker.read_text(), pid  # it was asked, refused, and killed
    second = wait_until(lambda: set(_trainers(marks)) - set(first), timeout=60,
                        message="the group never started again at 1", details=run.text)
    assert len(second) == 1 and _trainers(marks)[next(iter(second))].name.startswith("trainer-0-")
    assert "scaling the trainers 2 -> 1" in run.text()
    assert run.process.poll() is None

    run.process.send_signal(signal.SIGINT)  # the clean-up meets the same trainer at the end
    assert run.wait(timeout=60) == 128 + signal.SIGINT
    assert "SIGTERM ignored" in _trainers(marks)[next(iter(second))].read_text()
    wait_until(lambda: all(gone(pid) for pid in second) and job_processes(job_name) == [], timeout=10,
               message="children outlived the CLI")
