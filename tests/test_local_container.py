"""What `local train --image` hands the engine, without one: mounts, environment, the command line.

The real runs are in tests/test_local_image.py (podman); these pin the parts a run only shows
indirectly: which host paths are mounted where, which variables cross into the container and
how their paths are rewritten, and what the engine is asked to run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from paddlecloud.backends.local.container import ContainerSpec, Mount, job_mounts

pytestmark = pytest.mark.unit


def test_seed_002_s_mounts_one_input_root_output_and_package(tmp_path):
    (tmp_path / "data").mkdir()
    mounts = job_mounts(inputs=(str(tmp_path / "data" / "*.csv"),), output=tmp_path / "out",
                        package_path=tmp_path / "pkg")
    data = str(tmp_path / "data")
    assert mounts == (Mount(data, "/train/input"), Mount(data, data),
                      Mount(str(tmp_path / "out"), "/train/output", read_only=False),
                      Mount("", "/train/output/.paddlecloud", tmpfs=True),
                      Mount(f"{tmp_path}/out/.paddlecloud/tokens/trainer", "/var/run/paddlecloud/tokens/trainer"),
                      Mount(str(tmp_path / "pkg"), "/train/package"))
    assert [m.flag() for m in mounts][2:3] + [mounts[-1].flag()] == [f"{tmp_path}/out:/train/output",
                                                                    f"{tmp_path}/pkg:/train/package:ro"]


def test_several_input_roots_are_numbered_urls_are_not_mounted_and_system_dirs_not_shadowed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.csv").write_text("1\n")
    mounts = job_mounts(inputs=(str(tmp_path / "a" / "x.csv"), "/usr/share/dict/*", "s3://bucket/y"),
                        output=tmp_path / "out", package_path=None)
    assert [(m.host, m.target) for m in mounts] == [
        (str(tmp_path / "a"), "/train/input/0"), ("/usr/share/dict", "/train/input/1"),
        (str(tmp_path / "a"), str(tmp_path / "a")), (str(tmp_path / "out"), "/train/output"),
        ("", "/train/output/.paddlecloud"),
        (f"{tmp_path}/out/.paddlecloud/tokens/trainer", "/var/run/paddlecloud/tokens/trainer")]


def test_the_launchers_environment_crosses_with_mounted_paths_rewritten(tmp_path):
    spec = ContainerSpec(engine="/usr/bin/podman", image="img", job="j", run="r", env_names=("NUM_PASS",),
                         mounts=job_mounts(inputs=(), output=tmp_path / "out", package_path=None))
    env = spec.environment({
        "PATH": "/host/bin", "HOME": "/root", "PYTHONPATH": "/host/src", "NUM_PASS": "4", "OTHER": "x",
        "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "1", "POD_IP": "127.0.0.1",
        "PADDLE_JOB_TOKEN_FILE": f"{tmp_path}/out/.paddlecloud/tokens/trainer",
        "PADDLECLOUD_OUTPUT": f"{tmp_path}/out", "PADDLE_OUTPUT_LIKE": f"{tmp_path}/outside",
    })
    assert env == {
        "NUM_PASS": "4", "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "1", "POD_IP": "127.0.0.1",
        "PADDLE_JOB_TOKEN_FILE": "/var/run/paddlecloud/tokens/trainer",
        "PADDLECLOUD_OUTPUT": "/train/output",
        "PADDLE_OUTPUT_LIKE": f"{tmp_path}/outside",  # a sibling's prefix is not the mount
    }
    assert spec.name({"PADDLE_TRAINER_ID": "1"}) == "paddlecloud-j-trainer-1"


def test_the_engine_runs_the_image_s_entrypoint_or_the_module_through_its_sh():
    spec = ContainerSpec(engine="/usr/bin/docker", image="img:1", job="my job", run="r1",
                         mounts=(Mount("/d", "/train/input"),))
    argv = spec.for_role("pserver", module=None, args=("--lr", "0.1")).run_argv("n", ["B", "A"])
    assert argv == ["/usr/bin/docker", "run", "--rm", "--pull", "never", "--name", "n", "--network", "host",
                    "--label", "paddlecloud.job=my job", "--label", "paddlecloud.run=r1",
                    "-v", "/d:/train/input:ro", "-e", "A", "-e", "B", "img:1", "--lr", "0.1"]
    module = spec.for_role("trainer", module="demo.train", args=()).run_argv("n", [])
    assert module[module.index("--entrypoint"):module.index("-c")] == ["--entrypoint", "sh", "img:1"]
    assert module[-4] == "-c" and 'exec "$PY" -m "$@"' in module[-3] and module[-2:] == ["sh", "demo.train"]
    assert ContainerSpec.from_json(spec.to_json()) == spec
    assert spec.name({}) == "paddlecloud-my-job-trainer-0"
    assert Path(spec.wrapper_command()[0]).name.startswith("python")


def test_the_jobs_state_folder_is_hidden_and_only_the_trainer_token_and_ca_cross_read_only(tmp_path):
    out = tmp_path / "out"
    spec = ContainerSpec(engine="/usr/bin/podman", image="img", job="j", run="r",
                         mounts=job_mounts(inputs=(), output=out, package_path=None, tls=True))
    argv = spec.run_argv("n", [])
    # an empty tmpfs over OUTPUT/.paddlecloud: no operator token, no job.json, nothing to rewrite
    assert argv[argv.index("--tmpfs") + 1].startswith("/train/output/.paddlecloud:")
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{out}/.paddlecloud/tokens/trainer:/var/run/paddlecloud/tokens/trainer:ro" in volumes
    assert f"{out}/.paddlecloud/ca.crt:/var/run/paddlecloud/ca.crt:ro" in volumes
    assert not any("operator" in v or v.startswith(f"{out}/.paddlecloud:") for v in volumes), volumes
    env = spec.environment({"PADDLE_JOB_TOKEN_FILE": f"{out}/.paddlecloud/tokens/trainer",
                            "PADDLE_MASTER_CA_FILE": f"{out}/.paddlecloud/ca.crt"})
    assert env == {"PADDLE_JOB_TOKEN_FILE": "/var/run/paddlecloud/tokens/trainer",
                   "PADDLE_MASTER_CA_FILE": "/var/run/paddlecloud/ca.crt"}
