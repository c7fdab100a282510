"""The command-line options of the job model's fields, derived from the model.

`job submit` takes every field whose `Doors.flag` names an option, with the field's
help, kind and spellings (`paddlecloud.jobfields`); `local train` those with a local
door, with what one machine changes (`local_options`). `values_of` turns the parsed options back into JobSpec
fields, each parsed by its kind with errors that name the value. So a field added to
the model is on the command line without a line here.

What this does NOT do: defaults — an option not given is None (the PaddleJob's value
or the model's default then holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from paddlecloud.clitypes import ENV_STRING, Count
from paddlecloud.jobfields import CLI, LOCAL, Doors, doors_of
from paddlecloud.jobspec import (
    DataVolume,
    chunk_bytes,
    field_of,
    job_fields,
    parse_env,
    parse_secret_env,
)

logger = logging.getLogger(__name__)

ARGUMENT = "NAME"  # the job's name is `job submit`'s argument, not an option


def submit_fields() -> Iterator[tuple[str, Doors]]:
    """(field, doors) of every field `job submit` takes as an option, in the model's order."""
    for f in job_fields():
        doors = doors_of(f)
        if doors.flag is not None and doors.flag != ARGUMENT:
            yield f.name, doors


def _click_kwargs(doors: Doors) -> dict[str, Any]:
    if doors.flag_value is not None or doors.kind == "flag":
        return {"is_flag": True, "default": False}
    kwargs: dict[str, Any] = {"default": None, "metavar": doors.metavar}
    match doors.kind:
        case "count":
            kwargs["type"] = Count(min=doors.minimum or 0)
        case "integer":
            kwargs["type"] = int
        case "choice":
            kwargs["type"] = click.Choice([str(c) for c in doors.choices])
        case "directory":
            kwargs["type"] = click.Path(exists=True, file_okay=False)
        case "paths" | "secret_refs":
            kwargs.update(multiple=True, default=())
        case "pairs":
            kwargs.update(multiple=True, default=(), type=ENV_STRING)
    return kwargs


def _spec_option(name: str, *, door: str = CLI, **overrides: Any) -> Callable[[Any], Any]:
    """The click option of field `name` (its `job submit` spelling and parameter unless
    `door` is local train, whose parameter is `Doors.local`); `overrides` win."""
    doors = doors_of(field_of(name))
    param = doors.flag if door == CLI else doors.local
    spellings = ((doors.flag_names if param == doors.flag else ()) or
                 ("--" + param.replace("_", "-"),))
    kwargs = {**_click_kwargs(doors), "help": doors.help, **overrides}
    return click.option(*spellings, param, **kwargs)


def local_options(differences: Mapping[str, Mapping[str, Any]]) -> Callable[[Any], Any]:
    """Every `local train` option of the job model (`Doors.local`), in the model's order;
    a number defaults to the model's default (local train runs the job itself: no PaddleJob
    to defer to); `differences` are local train's own type, default or help of a field."""
    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(list(job_fields())):
            if doors_of(f).local is None:
                continue
            own = ({"default": f.default, "show_default": False}  # the help says the default
                   if doors_of(f).kind in ("count", "integer") and f.default is not None else {})
            command = _spec_option(f.name, door=LOCAL, **{**own, **differences.get(f.name, {})})(command)
        return command
    return apply


def submit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every `job submit` option of the job model, in the model's order in --help."""
    for name, _ in reversed(list(submit_fields())):
        command = _spec_option(name)(command)
    return command


def _value_of(doors: Doors, given: Any) -> Any:
    """The JobSpec value of an option as click parsed it; None when not given."""
    if given is None or given is False or given == ():  # never `in`: 0 == False
        return None
    if doors.flag_value is not None:
        return doors.flag_value
    match doors.kind:
        case "directory":
            return str(Path(given).resolve())
        case "paths":
            return tuple(given)
        case "pairs":
            return parse_env(given)
        case "secret_refs":
            return parse_secret_env(given)
        case "volume":
            return DataVolume.parse(given)
        case "size":
            return chunk_bytes(given, where=f"--{doors.flag.replace('_', '-')}")
    return given


def values_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """{JobSpec field: value} of every model option in `options` (None: not given)."""
    return {name: _value_of(doors, options.get(doors.flag)) for name, doors in submit_fields()}
