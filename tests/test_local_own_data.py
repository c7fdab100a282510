"""Jobs that bring their own data (docs/design.md section 12), run as a user of seed 002 runs
them: `paddlecloud local train --package-path=./demo --module=demo.train --input=...
--output=./out -e NUM_PASS=4` with a plain script that never asks the master for a task ends
0, and the script is told where its input, output and package are; the `paddle` client's
`-e` spellings (seed 002) are taken beside click's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A plain training script: it reads its input itself (no trainer_agent) and writes its model.
DEMO_TRAIN = textwrap.dedent('''
    import json, os, pathlib

    inputs = os.environ["PADDLECLOUD_INPUT"].split(",")
    output = pathlib.Path(os.environ["PADDLECLOUD_OUTPUT"])
    records = sum(len(pathlib.Path(p).read_text().splitlines()) for p in inputs)
    seen = {"inputs": inputs, "output": str(output), "records": records,
            "package": os.environ["PADDLECLOUD_PACKAGE"], "num_pass": os.environ["NUM_PASS"]}
    (output / "seen.json").write_text(json.dumps(seen))
''')


def _demo(tmp_path: Path) -> Path:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "__init__.py").write_text("")
    (demo / "train.py").write_text(DEMO_TRAIN)
    (tmp_path / "data.txt").write_text("1,2\n3,4\n5,6\n")
    return demo


# `-e NUM_PASS=4` as issue 31 writes it; `--e=NUM_PASS=4` and `-e=NUM_PASS=4` as seed 002 does
@pytest.mark.parametrize("env", [("-e", "NUM_PASS=4"), ("--e=NUM_PASS=4",), ("-e=NUM_PASS=4",)])
def test_a_plain_script_with_its_own_data_ends_0_and_was_told_where_everything_is(tmp_path, env):
    demo = _demo(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "local", "train", "--package-path=./demo",
         "--module=demo.train", f"--input={tmp_path / 'data.txt'}", "--output=./out", *env],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "none took a task from the master" in run.stdout + run.stderr
    seen = json.loads((tmp_path / "out" / "seen.json").read_text())
    assert seen == {"inputs": [str(tmp_path / "data.txt")], "output": str(tmp_path / "out"),
                    "records": 3, "package": str(demo), "num_pass": "4"}


@pytest.mark.parametrize("bad, message", [
    ("-e=NUM_PASS", "'=NUM_PASS' is not KEY=VALUE"),
    ("--e==4", "'=4' is not KEY=VALUE"),
])
def test_a_bad_env_spelling_is_one_usage_error_naming_it(tmp_path, bad, message):
    _demo(tmp_path)
    run = subprocess.run([sys.executable, "-m", "paddlecloud", "local", "train", "--package-path=./demo",
                          "--module=demo.train", f"--input={tmp_path / 'data.txt'}", bad],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr
    assert not (tmp_path / "output").exists()  # nothing started, nothing written
