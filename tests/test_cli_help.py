"""Every command's --help, walked from `paddlecloud` down: every option says what it does,
environment variables are shown one way (click's `[env var: NAME]`, never `$NAME` or
`[env: NAME]` in the text), defaults and choices agree, the same option has the same
range on `local train` and `job submit`, and an example's `KEY=VALUE` is never broken
across lines."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from paddlecloud.cli.main import main

pytestmark = pytest.mark.unit


def commands(group: click.Group = main, path: tuple[str, ...] = ()):
    context = click.Context(group)
    for name in group.list_commands(context):  # the components' come from entry points
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(commands())


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


def test_the_walk_finds_every_command():
    assert {("master",), ("local", "train"), ("job", "submit"), ("job", "scale"), ("credentials",),
            ("pserver",), ("operator",), ("server",), ("autoscaler",), ("trainer",)} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_says_what_it_does_and_shows_its_environment_one_way(path):
    command = COMMANDS[path]
    undocumented = [p.opts[0] for p in options(command) if not (p.help or "").strip()]
    assert not undocumented, f"{' '.join(path)}: no help for {undocumented}"
    for p in options(command):
        text = p.help or ""
        assert not re.search(r"\$[A-Z_]{2,}|\[env:|\[\$|\(\$", text), (p.opts[0], text)
        if p.envvar:
            assert p.show_envvar, f"{' '.join(path)} {p.opts[0]} reads {p.envvar} without saying so"
            assert p.envvar not in text, f"{p.opts[0]}: the env var twice ({text})"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_a_default_is_shown_as_one_of_the_choices_listed(path):
    output = " ".join(CliRunner().invoke(main, [*path, "--help"], terminal_width=200).output.split())
    for p in options(COMMANDS[path]):
        if isinstance(p.type, click.Choice) and isinstance(p.default, str) and p.show_default is not False:
            listed = re.search(rf"{re.escape(p.opts[-1])} \[([^\]]+)\]", output)
            default = re.search(rf"{re.escape(p.opts[-1])} \[[^\]]+\] .*?default: ([^;\]]+)[;\]]", output)
            if listed and default:
                assert default.group(1) in listed.group(1).split("|"), (p.opts[-1], default.group(1), listed.group(1))


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_rendered_help_keeps_examples_copy_pasteable(path):
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    broken = [line for line in result.output.splitlines() if re.search(r"[A-Z_]=$", line.rstrip())]
    assert not broken, broken


def test_credentials_help_gives_each_assignment_on_one_line():
    output = CliRunner().invoke(main, ["credentials", "--help"], terminal_width=80).output
    assert "PADDLE_JOB_TOKEN_FILE=DIRECTORY/tokens/ROLE" in output
    assert "PADDLE_MASTER_CA_FILE=DIRECTORY/ca.crt" in output


def test_local_train_and_job_submit_take_the_same_ranges():
    local = {p.name: p for p in options(COMMANDS["local", "train"])}
    submit = {p.name: p for p in options(COMMANDS["job", "submit"])}
    shared = [name for name in local.keys() & submit.keys() if isinstance(local[name].type, click.IntRange)]
    assert {"trainers", "min_trainers", "max_trainers", "pservers", "epochs", "restart_limit"} <= set(shared)
    for name in shared:
        a, b = local[name].type, submit[name].type
        assert (type(b), b.min, b.max) == (type(a), a.min, a.max), name


@pytest.mark.parametrize("path", [("local", "train"), ("job", "submit"), ("master",)], ids=" ".join)
def test_a_word_for_a_number_is_called_not_a_valid_integer(path):
    result = CliRunner().invoke(main, [*path, "--epochs", "abc"])
    assert result.exit_code == 2
    assert "'abc' is not a valid integer." in result.output, result.output
