"""`bench/dispatch.py --quick` runs end to end and prints its table. No timing is asserted:
speed goals live in the benchmark, never in tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "dispatch.py"


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--quick", "--ns", "--baseline", "--profile"):
        assert option in out.stdout


@pytest.mark.timeout(600)
def test_quick_run_prints_the_table(tmp_path):
    out = subprocess.run(
        # --allow-tmpfs: a smoke test checks the bench runs, not that its figures are durable ones
        [sys.executable, str(BENCH), "--quick", "--ns", "1,4", "--allow-tmpfs",
         "--json", str(tmp_path / "figures.json")],
        capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-4000:]}"
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["N", "tasks/s"])
    assert "no-op calls/s" in lines[header] and "master/no-op" in lines[header]
    rows = [lines[header + 2].split()[0], lines[header + 3].split()[0]]
    assert rows == ["1", "4"]
    assert "start-up to health SERVING" in out.stdout
    assert "Targets" in out.stdout
    assert (tmp_path / "figures.json").exists()
