"""`bench/elastic.py --runs 1 --quick` runs end to end and prints its table. No timing is asserted."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "elastic.py"


@pytest.mark.timeout(400)
def test_one_run_prints_every_row():
    out = subprocess.run([sys.executable, str(BENCH), "--runs", "1", "--quick"], capture_output=True, text=True,
                         timeout=380)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-4000:]}"
    for row in ("PS 2 -> 4: first record read by a new trainer",
                "PS 2 -> 4: first task finished by a new trainer",
                "collective 2 -> 3 (group restart): first record read by the new group",
                "records of the epoch read again after the restart"):
        assert row in out.stdout, out.stdout
    if importlib.util.find_spec("paddle") is not None:  # the resume rows run the paddle example
        for row in ("fit-a-line 2 -> 3 mid-epoch, epoch-granular restart: records consumed again",
                    "fit-a-line 2 -> 3 mid-epoch, mid-epoch resume, --checkpoint-every 4: "
                    "records consumed again"):
            assert row in out.stdout, out.stdout


def test_runs_below_one_are_refused_naming_the_value():
    out = subprocess.run([sys.executable, str(BENCH), "--runs", "0"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--runs 0: must be at least 1" in out.stderr
