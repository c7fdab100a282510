"""`paddlecloud pserver [options] -- <pserver command...>`: the pserver agent's command.

Environment in (docs/design.md section 8; the flags named win over it):
  PADDLE_ETCD_ENDPOINTS (--etcd-endpoints), PADDLE_JOB_NAME (--job),
  PADDLE_NAMESPACE (--namespace, default `local`), PADDLE_PSERVERS_NUM (required),
  PADDLE_TRAINERS_NUM (passed through), POD_IP (default 127.0.0.1), PADDLE_PORT
  (locally, unset: a free port chosen at the slot's first claim), PADDLE_PSERVER_ID or
  POD_NAME `...-<n>` (the StatefulSet ordinal; neither set: the first free slot).

Exit codes: 0 the job is done (or the pserver exited 0 by itself); 1 etcd
unreachable at start, an etcd error, or the lease lost; 2 bad input (one line on
stderr naming the value); otherwise the pserver's own exit code, 128+N for signal N.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import click

from paddlecloud.clitypes import DURATION, NON_NEGATIVE, log_level_option


@click.command("pserver", context_settings={"allow_interspersed_args": False})
@click.option("--etcd-endpoints", default=None, envvar="PADDLE_ETCD_ENDPOINTS", show_envvar=True,
              help="Comma-separated etcd URLs.")
@click.option("--job", default=None, envvar="PADDLE_JOB_NAME", show_envvar=True, help="Job name.")
@click.option("--namespace", default=None, envvar="PADDLE_NAMESPACE", show_envvar=True,
              help="Kubernetes namespace, or 'local'.")
@click.option("--restart-limit", type=NON_NEGATIVE, default=5, show_default=True,
              help="Restarts of a crashed pserver before the agent gives up.")
@click.option("--restart-backoff", type=DURATION, default="1s", show_default=True,
              help="Wait before the first restart; doubles each restart, up to 30s.")
@click.option("--grace", type=DURATION, default="10s", show_default=True,
              help="Between SIGTERM and SIGKILL when stopping the pserver.")
@click.option("--lease-ttl", type=DURATION, default="10s", show_default=True,
              help="TTL of the agent's etcd lease: how fast a dead agent's slot frees.")
@click.option("--trainers-grace", type=DURATION, default="60s", show_default=True,
              help="After the job's end, serve until its trainers left, at most this long.")
@click.option("--etcd-timeout", type=DURATION, default="10s", show_default=True,
              help="Give up at start when etcd does not answer within this.")
@log_level_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def pserver_command(etcd_endpoints, job, namespace, restart_limit, restart_backoff, grace, lease_ttl,
                    trainers_grace, etcd_timeout, log_level, command) -> None:
    """Claim a pserver slot in etcd, then run and supervise COMMAND as that pserver.

    The pserver starts once every slot is registered, with TRAINING_ROLE=PSERVER,
    PADDLE_PSERVER_ID, POD_IP, PADDLE_PORT and PADDLE_PSERVERS_IP_PORT_LIST set; it is
    restarted with PADDLECLOUD_PSERVER_RESTORE=1 after a crash (and started with it
    when the slot was served before, or when this agent's own environment sets it: a
    job resumed from a checkpoint), and stopped when the job is done and its trainers
    left (at most --trainers-grace).
    """
    import asyncio

    from paddlecloud.etcd import EtcdUnavailable
    from pserver_agent.agent import run_agent
    from pserver_agent.config import AgentConfig, AgentConfigError

    try:
        config = AgentConfig.from_env(
            os.environ, command=tuple(command), etcd_endpoints=etcd_endpoints, job=job,
            namespace=namespace, restart_limit=restart_limit, restart_backoff=restart_backoff,
            grace=grace, lease_ttl=lease_ttl, etcd_timeout=etcd_timeout,
            trainers_grace=trainers_grace)
    except AgentConfigError as error:
        _fail(str(error), code=2)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = asyncio.run(run_agent(config))
    except AgentConfigError as error:
        _fail(str(error), code=2)
    except EtcdUnavailable as error:
        _fail(str(error), code=1)
    except Exception as error:  # an etcd error mid-run: the agent's supervisor restarts it
        logging.getLogger("pserver_agent").debug("agent failed", exc_info=True)
        _fail(f"{type(error).__name__}: {error}", code=1)
    sys.exit(code)


def _fail(message: str, *, code: int) -> NoReturn:
    click.echo(f"paddlecloud pserver: error: {message}", err=True)
    sys.exit(code)
