"""What `python -m paddle.distributed.launch` reads in a trainer, per Paddle version, from the
env paddlecloud gives it: in the pods it renders and in `local train`'s trainers
(docs/kubernetes.md, "Paddle's launcher").

The pure tests follow each launcher's decisions on the rendered env, step by step as its code
takes them (the files named below, in Paddle 2.6.2's and 3.3.1's wheels); the `paddle` test
asks the installed Paddle's own launcher context. The podman runs of the same pods are in
k8s/test_run_rendered_pods.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.local.container import FORWARDED_PREFIXES
from paddlecloud.backends.local.deployer import LocalDeployer
from paddlecloud.jobspec import JobSpec, JobSpecError

INTRANETS = ("PodIP", "Service", "HostNetwork")
LEGACY_START_PORT = 6170  # fleet/launch.py's default port, used when PADDLE_PORT is not


def trainer_envs(spec: JobSpec) -> list[dict[str, str]]:
    """Each trainer pod's env as the kubelet builds it (downward API, then `$(VAR)`)."""
    template = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]["containers"][0]["env"]
    out = []
    for i in range(spec.trainers):
        downward = {"metadata.name": f"{spec.name}-trainer-{i}-abcde", "status.podIP": f"10.4.0.{i + 7}",
                    f"metadata.annotations['{manifests.COMPLETION_INDEX_ANNOTATION}']": str(i)}
        env: dict[str, str] = {}
        for entry in template:
            source = entry.get("valueFrom")
            if source is None:
                env[entry["name"]] = expand(entry["value"], env)
            elif "fieldRef" in source:
                env[entry["name"]] = downward[source["fieldRef"]["fieldPath"]]
        out.append(env)
    return out


def expand(value: str, env: dict[str, str]) -> str:
    for name, known in env.items():
        value = value.replace(f"$({name})", known)
    return value


def launcher_3(env: dict[str, str]) -> dict[str, Any]:
    """Paddle >= 2.3's launcher (paddle/distributed/launch, unchanged in this part from 2.6.2
    to 3.3.1): context/args_envs.py maps POD_IP, PADDLE_MASTER, PADDLE_NNODES, PADDLE_RANK to
    its args; plugins/__init__.py `collective_compatible` then takes the master from the first
    PADDLE_TRAINER_ENDPOINTS entry and the node count from their distinct hosts, and
    `rewrite_host_ip` makes POD_IP the node's ip (when it holds a dot); controllers/master.py
    `HTTPMaster.lazy_init`: the node whose ip is the master's host serves the rendezvous, every
    node waits for it ("master not ready" for ever when none does)."""
    endpoints = env["PADDLE_TRAINER_ENDPOINTS"].split(",")
    master = endpoints[0] if ":" in endpoints[0] else f"{endpoints[0]}:6768"
    assert env.get("PADDLE_MASTER", master) == master, "PADDLE_MASTER would lose to the endpoints"
    node_ip = env["POD_IP"] if "." in env["POD_IP"] else "(the host's own address)"
    return {"master": master, "nnodes": len({e.rsplit(":", 1)[0] for e in endpoints}),
            "serves": master.rsplit(":", 1)[0] in ("127.0.0.1", node_ip),
            "rank": int(env.get("PADDLE_RANK", "-1"))}


def launcher_2(env: dict[str, str]) -> dict[str, Any]:
    """Paddle 2.0-2.2's launcher (paddle/distributed/fleet/launch.py; `--legacy=true` from 2.3):
    fleet/cloud_utils.py `use_paddlecloud` needs PADDLE_TRAINERS, POD_IP, PADDLE_TRAINER_ID and
    TRAINER_PORTS_NUM, and `get_cluster_info` takes the cloud's cluster only with
    PADDLE_TRAINERS_NUM != 1 (else a one-node job of 127.0.0.1); `get_cloud_cluster` makes
    HOST:PADDLE_PORT per host of PADDLE_TRAINERS (one process per CPU pod), and
    launch_utils.py `get_cluster` finds the pod's own place by POD_IP in PADDLE_TRAINERS."""
    names = ("PADDLE_TRAINERS", "POD_IP", "PADDLE_TRAINER_ID", "TRAINER_PORTS_NUM")
    if any(n not in env for n in names) or int(env.get("PADDLE_TRAINERS_NUM", "1")) == 1:
        return {"world": 1, "endpoints": None}
    hosts = env["PADDLE_TRAINERS"].split(",")
    port = int(env["PADDLE_PORT"]) if int(env["TRAINER_PORTS_NUM"]) >= 1 else LEGACY_START_PORT
    endpoints = [f"{h}:{port}" for h in hosts]
    if "DISTRIBUTED_TRAINER_ENDPOINTS" in env:  # taken as given, TRAINER_PORTS_NUM per host
        endpoints = env["DISTRIBUTED_TRAINER_ENDPOINTS"].split(",")
        assert len(hosts) * int(env["TRAINER_PORTS_NUM"]) == len(endpoints)
    return {"world": len(hosts), "endpoints": endpoints,
            "place": hosts.index(env["POD_IP"]) if env["POD_IP"] in hosts else None,
            "rank": int(env["PADDLE_TRAINER_ID"])}


@pytest.mark.unit
@pytest.mark.parametrize("intranet", INTRANETS)
def test_paddle_3_s_launcher_meets_at_trainer_0_with_every_trainer(intranet):
    spec = JobSpec(name="rn", namespace="ml", module="rn.train", trainers=3, intranet=intranet)
    seen = [launcher_3(env) for env in trainer_envs(spec)]
    endpoints = trainer_envs(spec)[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert [s["serves"] for s in seen] == [True, False, False]  # one rendezvous, on trainer 0
    assert {s["master"] for s in seen} == {endpoints[0]}
    assert [s["nnodes"] for s in seen] == [3, 3, 3]
    assert [s["rank"] for s in seen] == [0, 1, 2]  # ranks stay the trainer ids
    for env in trainer_envs(spec):
        assert (env["PADDLE_MASTER"], env["PADDLE_NNODES"]) == (endpoints[0], "3")


@pytest.mark.unit
@pytest.mark.parametrize("intranet", INTRANETS)
def test_paddle_2_s_launcher_builds_one_job_of_every_trainer(intranet):
    spec = JobSpec(name="rn", namespace="ml", module="rn.train", trainers=3, intranet=intranet)
    for i, env in enumerate(trainer_envs(spec)):
        seen = launcher_2(env)
        assert seen["world"] == 3, env
        assert seen["endpoints"] == env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert seen["place"] == seen["rank"] == i
        assert env["TRAINER_PORTS_NUM"] == "1"


def local_trainer_envs(trainers: int, *, pservers: int = 0) -> list[dict[str, str]]:
    """What `local train`'s deployer gives each trainer's launcher (and, with --image, its
    container: every PADDLE*, POD_IP, TRAINER_PORTS_NUM, DISTRIBUTED_TRAINER_ENDPOINTS)."""
    deployer = LocalDeployer(trainers=trainers, pservers=pservers, trainer_command=["true"],
                             pserver_command=["true"], output=Path("/nonexistent"), restart_limit=0,
                             restart_mode="group", spawn=None, user_env=lambda: {"POD_IP": "127.0.0.1"},
                             restart_epoch=None, event=print)
    ports = [41000 + 7 * i for i in range(trainers)]  # the ports differ: one machine
    return [deployer._trainer_env(i, ports) for i in range(trainers)]


@pytest.mark.unit
def test_local_trainers_meet_at_trainer_0_with_either_launcher():
    envs = local_trainer_envs(3)
    seen = [launcher_3(env) for env in envs]
    assert [s["serves"] for s in seen] == [True, False, False]
    assert [(s["nnodes"], s["rank"]) for s in seen] == [(3, 0), (3, 1), (3, 2)]
    assert len({s["master"] for s in seen}) == 1
    for i, env in enumerate(envs):
        legacy = launcher_2(env)
        assert (legacy["world"], legacy["place"], legacy["rank"]) == (3, i, i)
        assert legacy["endpoints"] == env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"{env['POD_IP']}:{env['PADDLE_PORT']}"
        assert set(forwarded(env)) >= {"POD_IP", "TRAINER_PORTS_NUM", "DISTRIBUTED_TRAINER_ENDPOINTS",
                                       "PADDLE_MASTER", "PADDLE_TRAINERS"}  # into an --image container
    assert [env["POD_IP"] for env in local_trainer_envs(2, pservers=1)] == ["127.0.0.1"] * 2  # PS: as before


def forwarded(env: dict[str, str]) -> list[str]:
    return [name for name in env if name.startswith(FORWARDED_PREFIXES)]


@pytest.mark.unit
@pytest.mark.parametrize("intranet", INTRANETS)
def test_a_named_trainer_s_pod_ip_is_its_own_name_in_the_endpoints(intranet):
    """Collective, gloo and intranet Service trainers: POD_IP:PADDLE_PORT is their own endpoint,
    as a pserver's is in its list."""
    for spec in (JobSpec(name="rn", module="m", trainers=2, intranet=intranet),
                 JobSpec(name="g", module="m", trainers=2, pservers=1, with_gloo=1, intranet=intranet)):
        for i, env in enumerate(trainer_envs(spec)):
            own = f"{env['POD_IP']}:{env['PADDLE_PORT']}"
            assert env["PADDLE_TRAINER_ENDPOINTS"].split(",").index(own) == i
            assert env["PADDLE_CURRENT_ENDPOINT"] == own


@pytest.mark.unit
def test_ps_trainers_get_no_launcher_rendezvous_and_keep_the_pod_s_address():
    gloo = JobSpec(name="g", module="m", trainers=2, pservers=2, with_gloo=1)
    plain = JobSpec(name="p", module="m", trainers=2, pservers=2)
    for spec in (gloo, plain):
        for env in trainer_envs(spec):
            assert not {"PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_TRAINERS"} & set(env)
    assert [env["POD_IP"] for env in trainer_envs(plain)] == ["10.4.0.7", "10.4.0.8"]


@pytest.mark.parametrize("name", ["PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_RANK", "PADDLE_TRAINERS",
                                  "TRAINER_PORTS_NUM"])
@pytest.mark.unit
def test_a_user_s_env_may_not_set_what_the_launcher_is_told(name):
    with pytest.raises(JobSpecError, match=f"{name}.*set by paddlecloud"):
        JobSpec(name="rn", module="m", env=((name, "x"),)).validate()


@pytest.mark.paddle
def test_the_installed_paddle_s_launcher_reads_the_rendezvous_paddlecloud_renders():
    """The tests' Paddle (3.x) builds its launcher context from each trainer's env: the same
    master and node count everywhere, and only trainer 0's node ip is the master's host."""
    pytest.importorskip("paddle")
    envs = trainer_envs(JobSpec(name="rn", namespace="ml", module="m", trainers=2))
    probe = (
        "import json, os, sys\n"
        "sys.argv = ['launch', 'train_fleet.py']\n"
        "from paddle.distributed.launch.context import Context\n"
        "for env in json.loads(sys.stdin.read()):\n"
        "    os.environ.clear(); os.environ.update(env)\n"
        "    c = Context()\n"
        "    print(json.dumps([c.args.master, int(c.args.nnodes), c.node.ip, c.args.rank,"
        " c.is_legacy_mode()]))\n")
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    result = subprocess.run([sys.executable, "-c", probe], input=json.dumps([{**keep, **e} for e in envs]),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    master = envs[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")[0]
    assert seen == [[master, 2, "rn-trainer-0.rn-trainer.ml.svc", 0, False],
                    [master, 2, "rn-trainer-1.rn-trainer.ml.svc", 1, False]]
