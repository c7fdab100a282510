"""The chaos suite: whole local jobs under seeded faults, audited from logs and etcd history.

A failing seed prints the one command that reproduces it. Longer schedules for local
runs: `python -m tests.chaos.harness --seed 1 --seed 2 ... --faults 12 --epochs 5`, and
for collective runs `--mode collective ... --faults 6 --epochs 5` (`make chaos` runs both).
"""

from __future__ import annotations

import asyncio

import pytest

from chaos.harness import Chaos

pytestmark = pytest.mark.chaos


def run_and_show(chaos: Chaos, capsys, *, reproduce: str):
    """Runs the harness, prints its line; fails with the command that reproduces it."""
    result = asyncio.run(chaos.run())
    with capsys.disabled():
        print(f"\n{result.line()}")
    log = "\n".join(chaos.log_lines[-80:])
    assert result.ok, (f"{result.line()}\nreproduce: python -m tests.chaos.harness {reproduce}"
                       f"\n--- last lines of the job ---\n{log}")
    return result


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_job_survives_a_seeded_fault_schedule(tmp_path, seed, capsys):
    chaos = Chaos(seed=seed, workdir=tmp_path, trainers=4, epochs=3, faults=5)
    result = run_and_show(chaos, capsys, reproduce=f"--seed {seed} --faults 5")
    assert result.tasks_lost == 0 and result.double_counted == 0
    assert result.epochs_completed == 3


@pytest.mark.paddle
@pytest.mark.timeout(300)
def test_collective_job_keeps_every_record_once_in_the_model_through_group_restarts(tmp_path, capsys):
    pytest.importorskip("paddle")
    # seed 6's first faults: a trainer SIGKILLed (a group restart from a checkpoint inside
    # the epoch), then a trainer SIGSTOPped past its session lease. Four epochs, so that the
    # pause comes well before the last one: a lapse after the job's last task is recovered
    # by reopening the job, which tests/test_elastic_local.py shows on its own.
    seed, faults, epochs = 6, 2, 4
    chaos = Chaos(seed=seed, workdir=tmp_path, mode="collective", epochs=epochs, faults=faults)
    result = run_and_show(chaos, capsys,
                          reproduce=f"--mode collective --seed {seed} --faults {faults} --epochs {epochs}")
    assert len(result.faults) == faults and result.restarts >= 1
    assert result.seen_twice == 0 and [e.never_seen for e in result.lineage] == [0] * epochs
    assert result.tasks_lost == 0 and result.double_counted == 0 and result.epochs_completed == epochs
