"""Finding a job's processes through /proc, to kill one or to prove none is left."""

from __future__ import annotations

import os
from pathlib import Path


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (it runs no more)."""
    return _read(Path(f"/proc/{pid}/stat")).rpartition(b")")[2].split()[:1] in ([], [b"Z"])


def children(pid: int) -> list[int]:
    """The live children of `pid`, whichever of its threads started them."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in _read(task / "children").split() if not gone(int(child))]


def cmdline(pid: int) -> bytes:
    """The process's argv, NUL-separated (empty once it is gone)."""
    return _read(Path(f"/proc/{pid}/cmdline"))


def job_processes(job: str) -> list[tuple[int, list[str], dict[str, str]]]:
    """(pid, argv, env) of every live process whose environment or argv names the job."""
    found = []
    needle_env = f"PADDLE_JOB_NAME={job}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = [a.decode(errors="replace") for a in _read(entry / "cmdline").split(b"\0") if a]
        environ = _read(entry / "environ").split(b"\0")
        stat = _read(entry / "stat")
        if b") Z " in stat:  # a zombie is gone already
            continue
        if needle_env in environ or ("--job" in argv and job in argv):
            env = dict(e.decode(errors="replace").split("=", 1) for e in environ if b"=" in e)
            found.append((int(entry.name), argv, env))
    return found


def find(job: str, *, module: str, **env: str) -> list[int]:
    """Pids of the job's `python -m MODULE` processes whose environment matches `env`."""
    return [pid for pid, argv, penv in job_processes(job)
            if argv[1:3] == ["-m", module] and all(penv.get(k) == v for k, v in env.items())]
