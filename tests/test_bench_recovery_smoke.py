"""bench/recovery.py runs end to end on paddlecloud's side: a trainer SIGKILLed mid-epoch, the
job trains again and finishes, and the final model's lineage holds every record once per epoch.
No timing is asserted: speed lives in the benchmark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("paddle")
pytestmark = pytest.mark.paddle

BENCH = Path(__file__).resolve().parent.parent / "bench" / "recovery.py"


@pytest.mark.timeout(600)
def test_the_recovery_bench_runs_paddlecloud_s_side():
    out = subprocess.run([sys.executable, str(BENCH), "--only", "paddlecloud"], capture_output=True,
                         text=True, timeout=580)
    assert out.returncode == 0, out.stderr[-4000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("paddlecloud "))
    assert re.search(r"\d+\.\d s\s+True\s+\[0, 0, 0\]\s+\[0, 0, 0\]", row), out.stdout
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}
    for part in ("detection", "group", "epoch", "launcher", "Paddle", "gloo", "checkpoint", "first",
                 "trains"):
        # each part measured (a median and its run), not "-"
        assert re.match(r"\s+\S+( \S+)?\s+-?\d+\.\d\d \(-?\d+\.\d\d\)", rows[part]), rows.get(part)
