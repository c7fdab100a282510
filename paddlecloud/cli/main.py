"""The `paddlecloud` command: one entry point, one subcommand per component.

`job` and `local` are the CLI's own commands; each component's command (the master,
the agents, the operator, the job server, the autoscaler) is found through the
entry-point group `paddlecloud.commands` (pyproject.toml) and loaded only when it is
asked for, so the CLI, the top of the house, imports no component, and
`paddlecloud --help` stays fast.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

from paddlecloud.cli.jobs import job
from paddlecloud.cli.local import local

COMMANDS_GROUP = "paddlecloud.commands"


def component_commands() -> dict[str, EntryPoint]:
    """The components' commands this installation declares, by name."""
    return {point.name: point for point in entry_points(group=COMMANDS_GROUP)}


class ComponentGroup(click.Group):
    """A group whose commands beside its own come from the `paddlecloud.commands` entry points."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *component_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and (point := component_commands().get(cmd_name)) is not None:
            command = point.load()
        return command


@click.group(cls=ComponentGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="paddlecloud")
def main() -> None:
    """Fault-tolerant, elastic PaddlePaddle distributed training."""


main.add_command(job)
main.add_command(local)

if __name__ == "__main__":
    main()
