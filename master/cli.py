"""`paddlecloud master`: the per-job master process (flags of docs/design.md section 8)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from paddlecloud.clitypes import log_level_option
from paddlecloud.master_settings import MasterCommand, master_options


@click.command("master", cls=MasterCommand)
@master_options
@log_level_option
def master_command(log_level: str, **settings: Any) -> None:
    """Run the master of one job: hands out data tasks, keeps every lease in etcd."""
    from master.config import MasterConfig, SpecError
    from master.server import serve
    from paddlecloud import aio

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = MasterConfig.from_settings(settings)
        config.check_access()
    except (SpecError, ValueError) as error:
        raise click.UsageError(str(error)) from None
    sys.exit(aio.run(serve(config)))


@click.command("credentials")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--tls-host", "hosts", multiple=True, metavar="HOST",
              help="Also mint a CA (ca.crt) and a master certificate (master.crt, master.key) for HOST "
                   "(a DNS name or IP; repeatable).")
def credentials_command(directory: str, hosts: tuple[str, ...]) -> None:
    """Write a job's fresh tokens into DIRECTORY/tokens (trainer, operator, viewer; mode 0600).

    \b
    The master:  paddlecloud master --tokens-dir DIRECTORY/tokens ...
    A client:    PADDLE_JOB_TOKEN_FILE=DIRECTORY/tokens/ROLE
    With --tls-host, a client also: PADDLE_MASTER_CA_FILE=DIRECTORY/ca.crt"""
    from pathlib import Path

    from paddlecloud.auth import JobTokens
    from paddlecloud.tls import LocalCA, subject_name

    for host in hosts:  # all checked before anything is written
        try:
            subject_name(host)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--tls-host") from None
    root = Path(directory)
    try:
        tokens = JobTokens.generate().write(root / "tokens")
        click.echo(f"tokens in {tokens}: master --tokens-dir {tokens}")
        if hosts:
            ca = LocalCA.create()
            ca.write_cert(root / "ca.crt")
            issued = ca.issue(root, "master", hosts=hosts)
            click.echo(f"TLS: master --tls-cert {issued.cert} --tls-key {issued.key}; "
                       f"clients PADDLE_MASTER_CA_FILE={root / 'ca.crt'}")
    except OSError as error:  # a missing parent, a read-only place: say which, not a traceback
        raise click.ClickException(f"cannot write the credentials into {directory[:200]}: "
                                   f"{error.strerror or error}") from None
