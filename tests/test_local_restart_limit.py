"""A local collective job whose trainer dies at every start ends Failed at `--restart-limit`:
the group is started limit + 1 times (the first start and `limit` restarts), then the
deployer gives up with a reason naming the limit, instead of restarting forever.

The dying trainer is the stub trainer given a flag it does not know: its argument parser
exits 2 at every start, before it talks to the master."""

from __future__ import annotations

import re

import pytest
from datasets import write_records
from processes import job_processes

STUB = "trainer_agent.stub"
DIES = "unrecognized arguments: --no-such-flag"


@pytest.mark.parametrize("limit", [0, 2])
def test_a_group_dying_at_every_start_fails_after_limit_restarts(tmp_path, local_run, job_name,
                                                                etcd_endpoint, limit):
    write_records(tmp_path / "data", files=2, records_per_file=10)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "1",
                    "--restart-limit", str(limit), "--etcd-endpoints", etcd_endpoint,
                    "--", "--no-such-flag")
    assert run.wait(timeout=120) == 1, run.text()
    text = run.text()
    # one trainer in the group: every group start runs it once, and it dies once
    starts = (run.output / "logs" / "trainer-0.log").read_text().count(DIES)
    assert starts == limit + 1, text
    assert text.count("restarting the trainer group") == limit
    assert text.count("the master restarted epoch") == limit
    gave_up = re.findall(r"giving up on the trainers: (.*)", text)
    assert gave_up == [f"trainer 0 exited with 2; the trainer group was restarted {limit} times "
                       f"(--restart-limit {limit})"], text
    assert f"(--restart-limit {limit})" in next(line for line in text.splitlines() if "job Failed" in line)
    assert f"job {job_name} failed" in text
    assert job_processes(job_name) == []
