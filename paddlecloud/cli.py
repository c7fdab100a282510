"""The `paddlecloud` command: one entry point, one subcommand per component.

Each subcommand lives beside the component it runs and imports its heavy parts
only when it runs, so `paddlecloud --help` stays fast.
"""

from __future__ import annotations

import click

from autoscaler.cli import autoscaler_command
from job_server.cli import server_command
from master.cli import credentials_command, master_command
from paddlecloud.jobs_cli import job
from paddlecloud.local.cli import local
from pdj_operator.cli import operator_command
from pserver_agent.cli import pserver_command
from trainer_agent.launcher import trainer_command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="paddlecloud")
def main() -> None:
    """Fault-tolerant, elastic PaddlePaddle distributed training."""


main.add_command(master_command)
main.add_command(trainer_command)
main.add_command(job)
main.add_command(pserver_command)
main.add_command(local)
main.add_command(operator_command)
main.add_command(server_command)
main.add_command(credentials_command)
main.add_command(autoscaler_command)

if __name__ == "__main__":
    main()
