"""The chaos suite: whole local jobs under seeded faults, audited from logs and etcd history.

A failing seed prints the one command that reproduces it. Longer schedules for local
runs: `python -m tests.chaos.harness --seed 1 --seed 2 ... --faults 12 --epochs 5`.
"""

from __future__ import annotations

import asyncio

import pytest

from chaos.harness import Chaos

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_job_survives_a_seeded_fault_schedule(tmp_path, seed, capsys):
    chaos = Chaos(seed=seed, workdir=tmp_path, trainers=4, epochs=3, faults=5)
    result = asyncio.run(chaos.run())
    with capsys.disabled():
        print(f"\n{result.line()}")
    log = "\n".join(chaos.log_lines[-80:])
    assert result.ok, (f"{result.line()}\nreproduce: python -m tests.chaos.harness --seed {seed} --faults 5"
                       f"\n--- last lines of the job ---\n{log}")
    assert result.tasks_lost == 0 and result.double_counted == 0
    assert result.epochs_completed == 3
