"""click parameter types shared by the commands: durations, byte sizes and KEY=VALUE pairs.

Each type wraps one parser of `paddlecloud.units`, so a flag and a job spec field that
take the same kind of value accept the same spellings and name a bad value the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from paddlecloud.units import parse_duration, parse_key_value, parse_size


class ParsedType(click.ParamType):
    """A click type made of a parser that raises ValueError with a message naming the value."""

    def __init__(self, name: str, parse: Callable[[Any], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self._parse(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


DURATION = ParsedType("duration", parse_duration)
SIZE = ParsedType("size", parse_size)
KEY_VALUE = ParsedType("key=value", parse_key_value)
# `-e`'s names: `--e` and the `=` after `-e` are the `paddle` client's spellings (seed 002:
# `--e=NUM_PASS=4`, `-e=NUM_PASS=5`), beside click's `-e NUM_PASS=4` and `--env`.
ENV_OPTION_NAMES = ("-e", "--e", "--env", "env")


def env_pair(text: str) -> str:
    """One `-e` value as KEY=VALUE: `-e=K=V` reaches click as `=K=V` (no key starts with
    `=`), so that one `=` goes; raises ValueError naming the value as given otherwise."""
    pair = text[1:] if text.startswith("=") else text
    key, sep, _ = pair.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE, e.g. -e NUM_PASS=4 (or -e=NUM_PASS=4)")
    return pair


ENV_PAIR = ParsedType("key=value", lambda text: parse_key_value(env_pair(text)))
ENV_STRING = ParsedType("key=value", env_pair)  # KEY=VALUE kept as one string


class SeedSpellings(click.Command):
    """A command that answers the `paddle` client's `--image:<your image>` (seed 002: a colon
    where click takes `=` or a space) with click's "Did you mean --image?" instead of a bare
    "No such option": click suggests only names close to the whole word, image included."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            name, colon, _ = error.option_name.partition(":")
            if colon and any(name in p.opts for p in self.get_params(ctx) if isinstance(p, click.Option)):
                error.message = (f"No such option: {error.option_name[:80]} (a value follows '=' or "
                                 "a space, not ':').")
                error.possibilities = [name]
            raise


class Count(click.IntRange):
    """A whole number with bounds: "'abc' is not a valid integer." (click's own says "integer
    range", which names no mistake), shown as INTEGER with its range in --help."""

    name = "integer"


NON_NEGATIVE = Count(min=0)
POSITIVE = Count(min=1)
LOG_LEVELS = ("debug", "info", "warning", "error")  # any case; click lists them in lower case


def log_level_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-level`, the same on every service command (PADDLECLOUD_LOG_LEVEL sets it too)."""
    return click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info",
                        show_default=True, envvar="PADDLECLOUD_LOG_LEVEL", show_envvar=True,
                        help="Least severe log lines written (any case).")(fn)


def checkpoint_every_env(text: str) -> tuple[str, str]:
    """`--checkpoint-every TEXT` of `local train` and `job submit` as the trainers' environment
    entry, normalised; a usage error naming TEXT (exit 2) when it is neither tasks nor a duration."""
    from paddlecloud.checkpoints import CHECKPOINT_EVERY_ENV, CheckpointEvery

    try:
        return CHECKPOINT_EVERY_ENV, str(CheckpointEvery.parse(text))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="'--checkpoint-every'") from None
