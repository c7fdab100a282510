"""Helpers the benchmarks share: the machine, the disk, /proc figures, and real processes
(an etcd on disk, `paddlecloud master` children) with their health.

Every bench script runs as `python bench/<name>.py` from a checkout; `bench/` is then first
on sys.path, so `import common` finds this file.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/<name>.py` from a checkout
    sys.path.insert(0, str(ROOT))

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- /proc figures ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, all cores."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scrape(url: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (enough for our counters)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                found[name] = float(value)
    return found


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---- the machine and the disk -------------------------------------------------------


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    from paddlecloud.etcd_server import free_ports as ports
    return ports(count)


def filesystem_of(path: str) -> str:
    """The type of the file system `path` lives on, from /proc/mounts."""
    real, best, kind = os.path.realpath(path), "", "unknown"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, fstype = line.split()[:3]
            point = point.replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, fstype
    return kind


def fdatasync_ms(directory: str, rounds: int = 30) -> float:
    """Median time of a 4 KiB write + fdatasync on the etcd data dir's disk."""
    path = os.path.join(directory, "fsync-probe")
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for i in range(rounds):
            os.pwrite(fd, os.urandom(4096), i * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times) * 1e3


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0].replace("etcd Version: ", "") if out else "?"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes: with --chunk-bytes 1, `size` chunks. The master never reads it."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def refuse_tmpfs(directory: str, allow: bool) -> str:
    """The file system of `directory`; exits when it is tmpfs and that was not allowed."""
    fs = filesystem_of(directory)
    if fs in ("tmpfs", "ramfs") and not allow:
        raise SystemExit(f"{directory} is on {fs}: durable means fsynced to a disk; "
                         "give --dir on a real disk")
    return fs


def machine_lines(data_dir: str) -> list[str]:
    """Two or three lines that say where a run happened: machine, software, etcd and its disk."""
    import grpc
    from google.protobuf import __version__ as protobuf_version

    from paddlecloud.etcd_server import find_etcd_binary

    etcd_bin = find_etcd_binary()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return [
        f"machine: {os.cpu_count()} cores ({cpu_model()}), {mem_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}; load average before the run {load[0]:.2f}",
        f"software: Python {platform.python_version()}, grpcio {grpc.__version__}, protobuf {protobuf_version}",
        f"etcd: {etcd_version(etcd_bin)} ({etcd_bin}), data dir {data_dir} on {filesystem_of(data_dir)} "
        f"(4 KiB write+fdatasync median {fdatasync_ms(data_dir):.2f} ms); flags: paddlecloud's "
        "EtcdServer defaults (--auto-compaction-mode revision --auto-compaction-retention 100000), "
        "fsync on",
    ]


def summary(values: list[float]) -> dict:
    """median / min / max / all of a few repeated measurements."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered) if ordered else float("nan"),
            "min": ordered[0] if ordered else float("nan"),
            "max": ordered[-1] if ordered else float("nan"), "all": values}


# ---- real processes -----------------------------------------------------------------


def start_etcd(data_dir: Path):
    """etcd as paddlecloud starts it, its data in `data_dir` (kept by the caller)."""
    from paddlecloud.etcd_server import EtcdServer
    data_dir.mkdir(parents=True, exist_ok=True)
    return EtcdServer(str(data_dir)).start()


class Master:
    """`paddlecloud master` as a child process, its log in `log_dir`."""

    def __init__(self, *, job: str, etcd: str, log_dir: Path, args: list[str],
                 name: str = "master", tree: Path = ROOT) -> None:
        self.job = job
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{job}-{name}-{self.port}.log"
        self.command = [sys.executable, "-m", "paddlecloud", "master", "--job", job,
                        "--etcd-endpoints", etcd, "--port", str(self.port), "--host", "127.0.0.1",
                        "--advertise", self.address, *args]
        self.tree = tree
        self.process: subprocess.Popen | None = None

    def start(self) -> Master:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.tree != ROOT:  # `python -m` puts the cwd first on sys.path, PYTHONPATH next
            env["PYTHONPATH"] = os.pathsep.join([str(self.tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            cwd=str(self.tree))
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def serving(self, timeout: float = 1.0) -> bool:
        """One health check: True when SERVING."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=timeout)
            except grpc.RpcError:
                return False
            return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_serving(self, timeout: float = 120) -> float:
        """Waits for health SERVING; returns the seconds waited."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        started = time.perf_counter()
        deadline = started + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.perf_counter() < deadline:
                if not self.alive():
                    raise RuntimeError(f"master {self.job} exited with {self.process.returncode}; "
                                       f"see {self.log_path}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.perf_counter() - started
                except grpc.RpcError:
                    pass
                time.sleep(0.02)
        raise RuntimeError(f"master {self.job} not SERVING after {timeout}s; see {self.log_path}")

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


async def register_all(sessions: list, *, at_once: int) -> float:
    """Registers every `paddlecloud.master_client.Session`, `at_once` at a time (etcd refuses a
    storm of lease grants); the seconds it took."""
    import asyncio
    gate = asyncio.Semaphore(at_once)

    async def register(session) -> None:
        async with gate:
            await session.register()

    started = time.perf_counter()
    await asyncio.gather(*(register(s) for s in sessions))
    return time.perf_counter() - started


def table(cols: list[str], rows: list[list[str]]) -> list[str]:
    """A plain right-aligned text table."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return lines


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (and a note) when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("note: no plot drawn: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
