"""`paddlecloud job scale NAME --output OUTPUT` scales a running local job: the output
directory holds the job's handle (its masters, the last leader) and its operator token (and,
with --tls, the masters' CA), so no address from the log and no token path are needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from datasets import write_records
from waiting import wait_until

from paddlecloud.backends.local.handle import LocalJobHandle

STUB = "trainer_agent.stub"


def scale(job: str, output, trainers: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PADDLE_JOB_TOKEN_FILE", "PADDLE_MASTER_CA_FILE")}
    return subprocess.run([sys.executable, "-m", "paddlecloud", "job", "scale", job, "--output", str(output),
                           "--trainers", str(trainers)], capture_output=True, text=True, timeout=60, env=env)


def test_job_scale_output_scales_a_running_local_tls_job(tmp_path, local_run, job_name):
    write_records(tmp_path / "data", files=6, records_per_file=100)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "1",
                    "--min-trainers", "1", "--max-trainers", "3", "--pservers", "1",
                    "--pserver-module", "pserver_agent.stub", "--epochs", "2", "--chunk-bytes", "300",
                    "--tls", "--", "--delay", "0.03")
    wait_until(lambda: LocalJobHandle.path(run.output).exists() and LocalJobHandle.read(run.output).leader,
               timeout=60, message="no leader in the job's handle", details=run.text)
    refused = scale(job_name, run.output, 4)
    assert refused.returncode == 1 and "4 trainers is outside the job's range 1..3" in refused.stderr
    wrong = scale("another-job", run.output, 2)
    assert wrong.returncode == 1 and f"is local job {job_name}'s output, not another-job's" in wrong.stderr
    done = scale(job_name, run.output, 3)
    assert done.returncode == 0, done.stderr
    assert f"job {job_name}: desired trainers 3 (range 1..3)" in done.stdout
    wait_until(lambda: re.search(r"trainers alive 3 \(desired 3, range 1\.\.3\)", run.text()),
               timeout=90, message="3 trainers never alive", details=run.text)
    assert run.wait() == 0, run.text()
    gone = scale(job_name, run.output, 2)  # the job's end removed its handle
    assert gone.returncode == 1 and "no local job runs with --output" in gone.stderr


def test_job_scale_output_without_a_job_says_so_and_never_both_output_and_master(tmp_path):
    result = scale("nothing", tmp_path, 2)
    assert result.returncode == 1 and f"no local job runs with --output {tmp_path}" in result.stderr
    both = subprocess.run([sys.executable, "-m", "paddlecloud", "job", "scale", "j", "--output", str(tmp_path),
                           "--master", "127.0.0.1:1", "--trainers", "2"], capture_output=True, text=True)
    assert both.returncode == 2 and "give --output (a local job) or --master, not both" in both.stderr
