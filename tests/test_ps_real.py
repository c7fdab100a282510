"""Real PaddlePaddle fleet parameter servers under `paddlecloud local train --pservers` (issue 41).

The pservers and trainers run examples/wide_deep_ps on Paddle 2.6.2, in the PS venv of
tests/paddle_ps.py (built once per machine; skipped where it cannot be installed, failed under
CI); paddlecloud's launchers run in this venv and feed the trainers the master's tasks
(paddlecloud.taskfeed). The refusal of a Paddle without the PS core needs no PS venv.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EVAL = re.compile(r"^\[trainer (\d+)\] trainer \1: epoch (\d+) eval_loss ([\d.]+) tasks (\d+)", re.M)
START = re.compile(r"^\[trainer (\d+)\] trainer \1: start eval_loss ([\d.]+)", re.M)


def _local_train(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paddlecloud", "local", "train", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_a_ps_job_on_a_paddle_without_the_ps_core_is_refused_before_anything_starts(tmp_path):
    pytest.importorskip("paddle")
    import paddle

    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.txt").write_text("1 0 13 " + " ".join(["0.1"] * 13) + " 1 0.5\n")
    output = tmp_path / "out"
    result = _local_train(tmp_path, "--module", "examples.wide_deep_ps.train", "--package-path", str(ROOT),
                          "--pservers", "2", "--trainers", "2", "--input", str(data / "*.txt"),
                          "--output", str(output), timeout=120)
    if hasattr(paddle.base.core, "DistFleetWrapper"):
        pytest.skip(f"this venv's Paddle {paddle.__version__} has the PS core: nothing to refuse")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"PaddlePaddle {paddle.__version__}" in result.stderr
    assert "has no parameter-server core" in result.stderr
    assert 'pip install "paddlepaddle==2.6.2"' in result.stderr
    assert not output.exists()  # nothing started: no logs, no etcd, no output


@pytest.mark.container
def test_a_ps_job_in_an_image_without_the_ps_core_is_refused(tmp_path):
    import containers

    image = containers.paddle_base_image()  # this venv's Paddle (3.x: no PS core)
    pytest.importorskip("paddle")
    import paddle

    if hasattr(paddle.base.core, "DistFleetWrapper"):
        pytest.skip(f"Paddle {paddle.__version__} has the PS core: nothing to refuse")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.txt").write_text("x\n")
    result = _local_train(tmp_path, "--image", image, "--pservers", "1", "--input", str(data / "*.txt"),
                          "--output", str(tmp_path / "out"), timeout=180)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"PaddlePaddle {paddle.__version__} (image {image})" in result.stderr
    assert not (tmp_path / "out" / "logs").exists()


@pytest.mark.paddle_ps
@pytest.mark.timeout(420)
def test_wide_deep_ps_trains_to_the_end_on_real_pservers_and_they_are_stopped(tmp_path):
    from paddle_ps import paddle_ps_python

    python = paddle_ps_python()
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "examples.wide_deep_ps.data", str(data), "--rows", "1600"],
                   cwd=ROOT, check=True, capture_output=True)
    epochs = 3
    result = _local_train(
        tmp_path, "--module", "examples.wide_deep_ps.train", "--package-path", str(ROOT),
        "--python", str(python), "--pservers", "2", "--trainers", "2",
        "--input", str(data / "*.txt"), "--chunk-bytes", "50KiB", "--epochs", str(epochs),
        "-e", "PADDLECLOUD_TASK_FEED=1", "--output", str(tmp_path / "out"), "--job", "wide-deep",
        timeout=400)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-6000:]
    assert "job wide-deep succeeded" in console
    # the loss falls on both trainers: the model the pservers hold is shared and learns
    start = {t: float(v) for t, v in START.findall(console)}
    final = {t: float(v) for t, e, v, _ in EVAL.findall(console) if int(e) == epochs - 1}
    assert set(start) == set(final) == {"0", "1"}, console[-6000:]
    for trainer in ("0", "1"):
        assert final[trainer] < start[trainer] / 4, (start, final)
    # every epoch's tasks were dealt once between the two trainers (the master's count)
    tasks = {}
    for _, e, _, t in EVAL.findall(console):
        tasks[int(e)] = tasks.get(int(e), 0) + int(t)
    chunks = sum(-(-path.stat().st_size // (50 * 1024)) for path in data.glob("*.txt"))
    assert tasks == {epoch: chunks for epoch in range(epochs)}, tasks
    # Paddle's pservers never exit by themselves: paddlecloud stopped both, after the trainers
    assert console.count("serving until its trainers left") == 2, console[-6000:]
    assert console.count("is done (epoch 3 >= num_epochs 3): stopping the pserver") == 2
    assert "still hold sessions" not in console
