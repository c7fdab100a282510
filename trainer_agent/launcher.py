"""`paddlecloud trainer -- <command>`: starts a user's trainer once the job is ready.

It waits until the master serves (and, when the job has pservers, until every pserver
has registered), exports the PaddlePaddle environment of docs/design.md section 8, runs
the command as a child, forwards SIGTERM/SIGINT/SIGHUP to it, and exits with its
exit code (128 + signal number when the child was killed by a signal).

Environment in: PADDLE_TRAINER_ID (on Kubernetes, JOB_COMPLETION_INDEX when unset),
PADDLE_TRAINERS_NUM, PADDLE_PSERVERS_NUM, POD_IP, and the master's location
(PADDLE_MASTER_ENDPOINT, or PADDLE_ETCD_ENDPOINTS + PADDLE_JOB_NAME + PADDLE_NAMESPACE), and
PADDLECLOUD_START_GATE, a file: when set, the command starts only once the file exists (the
local backend's group restart opens it once the old group is gone; the launcher's own start
overlaps that stop); the command's environment does not carry it. PADDLECLOUD_TASK_FEED=1:
this launcher holds the trainer's master session itself and feeds the command the tasks as
files over a Unix socket whose path replaces the `1` (`trainer_agent.feed`,
`paddlecloud.taskfeed`: for programs on a Paddle that cannot load paddlecloud's gRPC code).
Environment out, added for the child: TRAINING_ROLE=TRAINER, PADDLE_TRAINER_ID,
PADDLE_TRAINERS_NUM, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_PSERVERS_NUM, POD_IP, and in a PS job
that has made progress (the master's epoch or done count) PADDLECLOUD_PS_MODEL_LIVE=1: a restarted
trainer 0 must not push fresh parameters over the pservers' model (`paddlecloud.fleet_ps`).

Quiet by default, each only where the environment does not set it already (set it to
have the noise back): `GLOG_minloglevel=2` (PaddlePaddle's C++ INFO and WARNING lines:
its startup banners, "create libuv server ..."), `PYTHONWARNINGS` ignoring Paddle's
"No ccache found" import warning, and `PADDLECLOUD_PADDLE_SIGNAL_HANDLER=0`, which makes
`trainer_agent.paddle` remove Paddle's C++ signal handler, the one that prints a crash
report ("C++ Traceback ... FatalError: `Termination signal` is detected") when the
trainer is stopped with SIGTERM or crashes. A child killed by a signal is reported
here in one line instead (`trainer 1 killed by SIGKILL`; `trainer 1 stopped by SIGTERM`
when it exited with 128+15 after the launcher forwarded SIGTERM: a trainer that left
the master first, see `trainer_agent.termination`).

Without a command it only waits, then exits 0: the init container (`wait-master`) that
holds a Kubernetes trainer pod's own program, which runs as written beside it
(`paddlecloud.backends.k8s.manifests`), until the job is ready.

What it does NOT do: restart the command. The backend (a Kubernetes Job, or
`paddlecloud local train`) restarts the launcher itself. Nor does it quiet what Paddle
writes unconditionally: `paddle.distributed.init_parallel_env()` prints its "Modified
FLAGS detected" banner whatever the environment says.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import click

from paddlecloud.api import pb
from paddlecloud.deployer import START_GATE_ENV
from paddlecloud.exits import describe_exit, exit_code, signal_exit_code
from paddlecloud.fleet_ps import MODEL_LIVE_ENV
from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator
from paddlecloud.taskfeed import FEED_ENV
from trainer_agent.client import MasterConnection, MasterUnavailable

logger = logging.getLogger(__name__)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: Set for the child unless the environment sets them (see the module docstring).
QUIET_DEFAULTS = {
    "GLOG_minloglevel": "2",
    "PYTHONWARNINGS": "ignore:No ccache found:UserWarning",
    "PADDLECLOUD_PADDLE_SIGNAL_HANDLER": "0",
}


def _positive_int(env: dict[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise click.UsageError(f"{name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise click.UsageError(f"{name}={raw!r} is not a whole number") from None
    if value < 0:
        raise click.UsageError(f"{name}={raw!r} must not be negative")
    return value


def wait_until_ready(connection: MasterConnection, *, pservers: int, timeout: float) -> pb.GetStatusResponse:
    """Polls GetStatus until the master serves and `pservers` pservers registered."""
    deadline = time.monotonic() + timeout
    while True:
        status = connection.get_status()
        if len(status.pserver_endpoints) >= pservers:
            return status
        if time.monotonic() > deadline:
            raise MasterUnavailable(
                f"only {len(status.pserver_endpoints)} of {pservers} pservers registered "
                f"after {timeout:g}s")
        time.sleep(0.2)


class GateClosed(RuntimeError):
    """The start gate did not open in time."""


def wait_for_gate(gate: str, *, timeout: float, poll: float = 0.02) -> None:
    """Waits until the file `gate` exists; raises GateClosed after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise GateClosed(f"the start gate {gate} did not open within {timeout:g}s")
        time.sleep(poll)


def trainer_environment(env: dict[str, str], status: pb.GetStatusResponse) -> dict[str, str]:
    out = {**QUIET_DEFAULTS, **env}
    trainer_id = env.get("PADDLE_TRAINER_ID") or env.get("JOB_COMPLETION_INDEX")
    if trainer_id is None:
        raise click.UsageError("PADDLE_TRAINER_ID is not set (nor JOB_COMPLETION_INDEX)")
    out.update(
        TRAINING_ROLE="TRAINER",
        PADDLE_TRAINER_ID=trainer_id,
        PADDLE_TRAINERS_NUM=str(_positive_int(env, "PADDLE_TRAINERS_NUM", 1)),
        PADDLE_PSERVERS_NUM=str(len(status.pserver_endpoints)),
        PADDLE_PSERVERS_IP_PORT_LIST=",".join(status.pserver_endpoints),
        POD_IP=env.get("POD_IP") or "127.0.0.1",
    )
    if status.pserver_endpoints and (status.current_epoch > 0 or status.counts.done > 0):
        out[MODEL_LIVE_ENV] = "1"  # the pservers hold a trained model: trainer 0 must not reset it
    return out


def run_child(command: list[str], env: dict[str, str]) -> int:
    """Runs `command`, forwarding signals; returns its exit code (128+N when killed by N).

    A death by signal is logged in one line naming the trainer and the signal; so is an
    exit with 128+N after this launcher forwarded signal N (a trainer that left the master
    on SIGTERM first, `trainer_agent.termination`, exits so)."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as error:
        raise click.UsageError(f"cannot run {command[0]!r}: {error.strerror}") from None

    forwarded: list[int] = []

    def forward(signum, _frame):
        if child.poll() is None:
            forwarded.append(signum)
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    trainer = env.get("PADDLE_TRAINER_ID", "?")
    if code < 0:
        logger.warning("trainer %s %s", trainer, describe_exit(code))
    elif forwarded and code == signal_exit_code(forwarded[-1]):
        logger.warning("trainer %s stopped by %s", trainer, signal.Signals(forwarded[-1]).name)
    return exit_code(code)


@click.command("trainer", context_settings={"ignore_unknown_options": True})
@click.option("--wait-timeout", default=600.0, show_default=True, type=float,
              help="Seconds to wait for the master and the pservers before giving up.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trainer_command(wait_timeout: float, command: tuple[str, ...]) -> None:
    """Run a trainer command once the job is ready, with the PaddlePaddle environment.

    Without COMMAND: wait until the job is ready (the master serves, every pserver
    registered), then exit 0.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = dict(os.environ)
    gate = env.pop(START_GATE_ENV, None)
    try:
        locator = MasterLocator.from_env(env)
    except (DiscoveryError, ValueError) as error:
        raise click.UsageError(str(error)) from None
    pservers = _positive_int(env, "PADDLE_PSERVERS_NUM", 0)
    connection = MasterConnection(locator, deadline=wait_timeout)
    try:
        status = wait_until_ready(connection, pservers=pservers, timeout=wait_timeout)
        if gate:
            wait_for_gate(gate, timeout=wait_timeout)
            status = wait_until_ready(connection, pservers=pservers, timeout=wait_timeout)  # as of now
    except (MasterUnavailable, GateClosed) as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    finally:
        connection.close()
    if not command:
        logger.info("the master serves and %d pservers registered", len(status.pserver_endpoints))
        sys.exit(0)
    child_env = trainer_environment(env, status)
    if env.get(FEED_ENV) == "1":
        sys.exit(run_fed_child(list(command), child_env))
    sys.exit(run_child(list(command), child_env))


def run_fed_child(command: list[str], env: dict[str, str]) -> int:
    """`run_child` with the task feed (trainer_agent.feed): this launcher holds the trainer's
    session and hands the command the tasks as files; the feed stops when the command exits."""
    from trainer_agent.client import TaskClient
    from trainer_agent.feed import TaskFeedServer, feed_env

    client = TaskClient.from_env(prefetch=False)
    try:
        server = TaskFeedServer(client).start()
        try:
            code = run_child(command, feed_env(server, env))
        finally:
            server.close()
        if server.error is not None:
            logger.error("the task feed failed: %s", server.error)
        return code
    finally:
        client.close()
