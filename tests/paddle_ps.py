"""A PS-capable PaddlePaddle for the tests: a venv of its own with Paddle 2.6.2, once per machine.

PaddlePaddle's wheels have no parameter-server core from 3.1.1 on (docs/design.md, "Parameter-server jobs on real Paddle"),
so the real fleet PS tests run their pservers and trainers' programs in a second venv:
`paddlepaddle==2.6.2` with `numpy<2` and `protobuf>=4.21,<5`. That protobuf cannot be
paddlecloud's (its generated code needs protobuf 7), which is why the venv is separate: the
paddlecloud launchers run in the project's venv, the user's program in this one (`--python`
of `paddlecloud local train`), and the two talk through the task feed (paddlecloud/taskfeed.py),
which needs neither grpc nor protobuf.

The venv lives in `$PADDLECLOUD_PS_VENV`, else `~/.cache/paddlecloud/paddle-ps-2.6.2`; it is
made under a file lock (two pytest workers never build it twice) from pip's cache or the
package index, and checked by the PS-core probe before use. Where it cannot be installed the
caller is skipped, except under CI (`CI=true`), where a missing one FAILS, as the other real
parts' fixtures do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.real_parts import file_lock, require

PADDLE_VERSION = "2.6.2"
REQUIREMENTS = (f"paddlepaddle=={PADDLE_VERSION}", "numpy<2", "protobuf>=4.21,<5")
LOCK = Path(tempfile.gettempdir()) / "paddlecloud-test-paddle-ps.lock"
INSTALL_TIMEOUT = 900
# The probe of paddlecloud/paddle_probe.py: a PS core has DistFleetWrapper
PROBE = ("import paddle, sys; core = getattr(paddle, 'base', None) or paddle.fluid; "
         "core = core.core; sys.exit(0 if hasattr(core, 'DistFleetWrapper') else 3)")


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "paddlecloud" / f"paddle-ps-{PADDLE_VERSION}"
    return Path(os.environ.get("PADDLECLOUD_PS_VENV") or default)


def _locked() -> contextlib.AbstractContextManager[None]:
    return file_lock(LOCK)


def _usable(python: Path) -> bool:
    if not python.exists():
        return False
    result = subprocess.run([str(python), "-c", PROBE], capture_output=True, timeout=120)
    return result.returncode == 0


def _install(folder: Path) -> str:
    """Builds the venv in place (a venv's scripts name its path); "" or why it failed. A
    half-built venv fails the probe, so the next caller builds it again."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    steps = ([sys.executable, "-m", "venv", str(folder)],
             [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS])
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if result.returncode != 0:
                shutil.rmtree(folder, ignore_errors=True)
                return f"{' '.join(step[:4])} ... exited {result.returncode}: {result.stderr[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as error:
        shutil.rmtree(folder, ignore_errors=True)
        return f"{type(error).__name__}: {error}"
    return ""


def missing() -> str:
    """Why no PS-capable Paddle can be had here ("" when the venv is ready); builds it once."""
    folder = venv_dir()
    python = folder / "bin" / "python"
    with _locked():
        if _usable(python):
            return ""
        why = _install(folder)
        if why:
            return f"cannot install {' '.join(REQUIREMENTS)} into {folder}: {why}"
        if not _usable(python):
            return f"{folder} was installed but its Paddle has no PS core (DistFleetWrapper)"
    return ""


def paddle_ps_python() -> Path:
    """The PS venv's python; skips the test where it cannot be had, fails it under CI."""
    require(missing(), needs="a PS-capable PaddlePaddle for the real PS tests")
    return venv_dir() / "bin" / "python"
