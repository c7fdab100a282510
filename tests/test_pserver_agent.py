"""The pserver agent with a real etcd and real processes: `python -m paddlecloud pserver -- stub`.

Each agent runs `pserver_agent.stub` as its pserver; the stub appends a JSON line per
start/stop/crash to a log of its own agent, which is how these tests see what each
pserver was told.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import waiting
from processes import gone

from paddlecloud.etcd import connect
from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 30.0


class Agent:
    """One `paddlecloud pserver` process, its log, and the events of its stub pservers."""

    def __init__(self, name: str, *, tmp: Path, etcd: str, job: str, pservers: int | None,
                 env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 stub_args: tuple[str, ...] = (), command: tuple[str, ...] | None = None) -> None:
        self.name = name
        self.log_path = tmp / f"agent-{name}.log"
        self.stub_log = tmp / f"stub-{name}.jsonl"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("PADDLE_", "POD_", "PADDLECLOUD_"))}
        self.env = dict(base, PYTHONUNBUFFERED="1", PADDLE_ETCD_ENDPOINTS=etcd, PADDLE_JOB_NAME=job,
                        PADDLECLOUD_STUB_LOG=str(self.stub_log))
        if pservers is not None:
            self.env["PADDLE_PSERVERS_NUM"] = str(pservers)
        self.env.update(env or {})
        pserver = command if command is not None else (sys.executable, "-m", "pserver_agent.stub", *stub_args)
        self.argv = [sys.executable, "-m", "paddlecloud", "pserver", "--lease-ttl", "2s",
                     "--restart-backoff", "50ms", "--grace", "5s", *args, "--", *pserver]
        self.process: subprocess.Popen | None = None

    def start(self) -> Agent:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, cwd=REPO)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.stub_log.exists():
            return []
        rows = [json.loads(line) for line in self.stub_log.read_text().splitlines() if line.strip()]
        return [row for row in rows if kind is None or row["event"] == kind]

    def starts(self) -> list[dict]:
        """The environment of each pserver start, in order."""
        return [row["env"] for row in self.events("start")]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {self.name} still running after {timeout}s:\n{self.log()}") from None

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def stop(self) -> None:
        if self.running():
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def agents(tmp_path, etcd_endpoint, job_name):
    """Starts agents of this test's job; kills whatever still runs after the test."""
    started: list[Agent] = []

    def start(name: str, *, pservers: int | None = 2, job: str | None = None, **kwargs) -> Agent:
        agent = Agent(name, tmp=tmp_path, etcd=etcd_endpoint, job=job or job_name, pservers=pservers,
                      **kwargs).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
    # No stub pserver outlives its agent, even a SIGKILLed one (they die with it).
    pids = {row["pid"]: agent.name for agent in started for row in agent.events("start")}
    deadline = time.monotonic() + 10
    while any(not gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if not gone(pid)], f"pservers outlived their agents: {pids}"


@pytest.fixture
async def etcd(etcd_endpoint):
    client = await connect(etcd_endpoint)
    yield client
    await client.close()


@pytest.fixture
def keys(job_name) -> JobKeys:
    return JobKeys("local", job_name)




async def eventually(predicate, *, timeout: float = DEADLINE, what: str = "", agents=()):
    """Polls `predicate` (sync or async) until it returns a truthy value, which it returns."""
    return await waiting.wait_for(predicate, timeout=timeout, message=what,
                          details=lambda: "\n".join(f"--- agent {a.name}:\n{a.log()}" for a in agents))


async def registrations(client, keys: JobKeys) -> dict[int, str]:
    prefix = keys.kind_prefix("pservers")
    return {int(kv.key[len(prefix):]): kv.value.decode() for kv in await client.get_prefix(prefix)}


async def slot_endpoints(client, keys: JobKeys) -> dict[int, str]:
    prefix = keys.kind_prefix("pserver-slots")
    return {int(kv.key[len(prefix):]): kv.value.decode() for kv in await client.get_prefix(prefix)}


def ask(endpoint: str) -> dict:
    """Asks the stub pserver at `endpoint` for its environment over TCP."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"env?\n")
        return json.loads(sock.makefile().readline())


def own_endpoint(env: dict) -> str:
    return f"{env['POD_IP']}:{env['PADDLE_PORT']}"


# ---- slots ----------------------------------------------------------------------------------

async def test_three_agents_for_two_slots_the_third_takes_over_a_killed_ones_slot(agents, etcd, keys):
    trio = [agents(name) for name in ("a", "b", "c")]

    def two_serving():
        serving = [a for a in trio if a.starts()]
        return serving if len(serving) == 2 else None

    serving = await eventually(two_serving, what="two pservers started", agents=trio)
    (waiting,) = [a for a in trio if a not in serving]
    await eventually(lambda: "slots are taken: waiting" in waiting.log(), what="third agent waits",
                     agents=trio)
    registered = await registrations(etcd, keys)
    assert sorted(registered) == [0, 1]
    assert sorted(int(a.starts()[0]["PADDLE_PSERVER_ID"]) for a in serving) == [0, 1]
    assert waiting.running() and waiting.starts() == []

    victim = serving[0]
    slot = int(victim.starts()[0]["PADDLE_PSERVER_ID"])
    endpoint = registered[slot]
    assert own_endpoint(victim.starts()[0]) == endpoint
    victim.signal(signal.SIGKILL)
    await victim.wait()

    env = (await eventually(waiting.starts, what="third agent takes the slot", agents=trio))[0]
    assert env["PADDLE_PSERVER_ID"] == str(slot)
    assert own_endpoint(env) == endpoint  # the slot keeps its endpoint (same port)
    assert env["PADDLECLOUD_PSERVER_RESTORE"] == "1"  # the slot was served before
    assert (await registrations(etcd, keys))[slot] == endpoint
    assert ask(endpoint)["pid"] == waiting.events("start")[0]["pid"]  # the new pserver listens there
    assert serving[1].running() and len(serving[1].starts()) == 1  # the other pserver is untouched


async def test_pserver_starts_only_after_every_slot_is_registered(agents, etcd, keys):
    first = agents("first")
    await eventually(lambda: "1 of 2 slots registered" in first.log(), what="first waits for the rest",
                     agents=[first])
    assert list(await registrations(etcd, keys)) == [0]
    assert first.starts() == [] and first.running()

    second = agents("second")
    both = [first, second]
    await eventually(lambda: all(a.starts() for a in both), what="both pservers start", agents=both)
    assert [a.starts()[0]["PADDLE_PSERVER_ID"] for a in both] == ["0", "1"]


async def test_each_pserver_finds_its_own_endpoint_once_in_the_same_ordered_list(agents, etcd, keys):
    group = [agents(f"p{i}", pservers=3, env={"PADDLE_TRAINERS_NUM": "4"}) for i in range(3)]
    envs = await eventually(lambda: [a.starts()[0] for a in group] if all(a.starts() for a in group)
                            else None, what="three pservers start", agents=group)
    registered = await registrations(etcd, keys)
    in_slot_order = [registered[i] for i in range(3)]
    assert len(set(in_slot_order)) == 3
    assert in_slot_order == [(await slot_endpoints(etcd, keys))[i] for i in range(3)]
    for env in envs:
        listed = env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
        assert listed == in_slot_order
        assert listed.count(own_endpoint(env)) == 1
        assert listed.index(own_endpoint(env)) == int(env["PADDLE_PSERVER_ID"])
        assert env["TRAINING_ROLE"] == "PSERVER"
        assert env["PADDLE_PSERVERS_NUM"] == "3" and env["PADDLE_TRAINERS_NUM"] == "4"
        assert env["PADDLE_JOB_NAME"] == keys.job and env["PADDLE_NAMESPACE"] == "local"
        assert env["PADDLECLOUD_PSERVER_RESTORE"] == "0" and env["PADDLECLOUD_RESTART_COUNT"] == "0"
        assert ask(own_endpoint(env))["env"]["PADDLE_PSERVER_ID"] == env["PADDLE_PSERVER_ID"]


@pytest.mark.parametrize("ordinal_env", [{"PADDLE_PSERVER_ID": "1"}, {"POD_NAME": "job-ps-1"}],
                         ids=["PADDLE_PSERVER_ID", "POD_NAME"])
async def test_kubernetes_ordinal_takes_its_own_slot(agents, etcd, keys, ordinal_env):
    ordinal = agents("ordinal", env=ordinal_env)
    await eventually(lambda: "1 of 2 slots registered" in ordinal.log(), what="slot 1 claimed",
                     agents=[ordinal])
    assert list(await registrations(etcd, keys)) == [1]

    free = agents("free")
    both = [ordinal, free]
    await eventually(lambda: all(a.starts() for a in both), what="both pservers start", agents=both)
    assert ordinal.starts()[0]["PADDLE_PSERVER_ID"] == "1"
    assert free.starts()[0]["PADDLE_PSERVER_ID"] == "0"


# ---- supervision ----------------------------------------------------------------------------

async def test_crashing_pserver_is_restarted_then_the_agent_gives_up_and_frees_its_slot(
        agents, etcd, keys):
    crashing = agents("crashing", pservers=1, args=("--restart-limit", "2"),
                      stub_args=("--crash-after", "0.2"))
    await eventually(crashing.starts, what="first pserver start", agents=[crashing])
    standby = agents("standby", pservers=1)
    await eventually(lambda: "slots are taken: waiting" in standby.log(), what="standby waits",
                     agents=[crashing, standby])

    assert await crashing.wait() == 3  # the stub's crash code: past the limit, the agent gives up
    starts = crashing.starts()
    assert [env["PADDLECLOUD_RESTART_COUNT"] for env in starts] == ["0", "1", "2"]
    assert [env["PADDLECLOUD_PSERVER_RESTORE"] for env in starts] == ["0", "1", "1"]
    assert len({own_endpoint(env) for env in starts}) == 1  # a restart keeps the endpoint
    assert len(crashing.events("crash")) == 3

    # Its slot is free again: the standby takes it at once and restores.
    env = (await eventually(standby.starts, what="standby takes the slot", agents=[standby]))[0]
    assert env["PADDLE_PSERVER_ID"] == "0" and own_endpoint(env) == own_endpoint(starts[0])
    assert env["PADDLECLOUD_PSERVER_RESTORE"] == "1" and env["PADDLECLOUD_RESTART_COUNT"] == "0"


async def test_sigterm_is_forwarded_and_the_agent_exits_with_the_pservers_code(agents, etcd, keys):
    agent = agents("solo", pservers=1, args=("--lease-ttl", "30s"), stub_args=("--term-exit-code", "7"))
    await eventually(agent.starts, what="pserver start", agents=[agent])
    agent.signal(signal.SIGTERM)
    assert await agent.wait() == 7
    assert [row["signal"] for row in agent.events("stop")] == ["SIGTERM"]
    # Released on exit, not by the 30 s lease lapsing.
    assert await registrations(etcd, keys) == {}


async def test_lost_lease_stops_the_pserver_and_the_agent_exits_1(agents, etcd, keys):
    agent = agents("solo", pservers=1)
    await eventually(agent.starts, what="pserver start", agents=[agent])
    registration = await etcd.get(keys.pserver(0))
    await etcd.revoke_lease(registration.lease)  # as if etcd had let the lease lapse
    assert await agent.wait() == 1
    assert [row["signal"] for row in agent.events("stop")] == ["SIGTERM"]
    assert "lost etcd lease" in agent.log()


# ---- the end of the job -----------------------------------------------------------------------

async def test_job_succeeded_stops_the_pservers_and_the_agents_exit_zero(agents, etcd, keys):
    polite = agents("polite")
    stubborn = agents("stubborn", args=("--grace", "500ms"), stub_args=("--ignore-sigterm",))
    both = [polite, stubborn]
    await eventually(lambda: all(a.starts() for a in both), what="both pservers start", agents=both)
    await etcd.put(keys.phase, b"Succeeded")
    assert [await a.wait() for a in both] == [0, 0]
    assert [row["signal"] for row in polite.events("stop")] == ["SIGTERM"]
    assert stubborn.events("stop") == []  # it ignored SIGTERM and was SIGKILLed after the grace
    assert "SIGKILL" in stubborn.log()
    assert await registrations(etcd, keys) == {}


async def test_last_epoch_done_stops_the_pserver(agents, etcd, keys):
    await etcd.put(keys.spec, json.dumps({"paths": ["x"], "num_epochs": 2}).encode())
    await etcd.put(keys.epoch, b"1")
    agent = agents("solo", pservers=1)
    await eventually(agent.starts, what="pserver start", agents=[agent])
    assert agent.running()
    await etcd.put(keys.epoch, b"2")
    assert await agent.wait() == 0
    assert "epoch 2 >= num_epochs 2" in agent.log()


async def test_agent_of_a_finished_job_exits_zero_without_claiming(agents, etcd, keys):
    await etcd.put(keys.phase, b"Failed")
    agent = agents("late", pservers=1)
    assert await agent.wait() == 0
    assert agent.starts() == [] and await slot_endpoints(etcd, keys) == {}


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("pservers", "env", "command", "named"), [
    (None, {}, None, "PADDLE_PSERVERS_NUM is not set"),
    (0, {}, None, "PADDLE_PSERVERS_NUM='0'"),
    ("two", {}, None, "PADDLE_PSERVERS_NUM='two'"),
    (2, {"PADDLE_PSERVER_ID": "2"}, None, "pserver index 2 (from PADDLE_PSERVER_ID=2) is out of range"),
    (2, {"PADDLE_PORT": "http"}, None, "PADDLE_PORT='http'"),
    (2, {}, (), "no pserver command"),
    (2, {}, ("no-such-pserver-binary",), "'no-such-pserver-binary' not found"),
], ids=["pservers-missing", "pservers-zero", "pservers-not-int", "index-out-of-range", "bad-port",
        "no-command", "command-not-found"])
async def test_bad_input_is_one_line_naming_the_value_exit_2(agents, etcd, keys, pservers, env,
                                                             command, named):
    agent = agents("bad", pservers=pservers, env=env, command=command)
    assert await agent.wait() == 2
    lines = [line for line in agent.log().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("paddlecloud pserver: error: "), lines
    assert named in lines[0]
    assert await registrations(etcd, keys) == {} and await slot_endpoints(etcd, keys) == {}


async def test_unreachable_etcd_exits_1_naming_the_endpoint(agents):
    nowhere = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    agent = agents("lost", args=("--etcd-endpoints", nowhere, "--etcd-timeout", "1s"))
    assert await agent.wait(timeout=20) == 1
    assert time.monotonic() - started < 20
    errors = [line for line in agent.log().splitlines() if "error:" in line]
    assert len(errors) == 1 and f"etcd unreachable at {nowhere}" in errors[0], agent.log()
