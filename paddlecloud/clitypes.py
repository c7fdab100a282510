"""click parameter types shared by the commands: durations and byte sizes."""

from __future__ import annotations

import click

from paddlecloud.units import parse_duration, parse_size


class DurationType(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx) -> float:
        try:
            return parse_duration(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


class SizeType(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx) -> int:
        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


DURATION = DurationType()
SIZE = SizeType()
NON_NEGATIVE = click.IntRange(min=0)
