"""What each front door needs of a job field, written once beside the field.

A job reaches paddlecloud through five doors: `paddlecloud job submit` (its flags), a
PaddleJob YAML (`job submit -f` and the operator), the Python API (`PaddleJob(...)`),
the Job Server's `POST /v1/trainer/job`, and `paddlecloud local train`. Each field of
`paddlecloud.jobspec.JobSpec` carries a `Doors` in its dataclass metadata: its help
text, the kind of value it takes, and under which name each door takes it — or why a
door does not (`not_at`). The doors are derived from this (the submit options, the
PaddleJob translation of paddlecloud's own keys and their CRD schema, the Job Server's
request model and the Python API's parameters), so adding a field means adding it to
the model, its check, and the code that acts on it.

What this does NOT do: parse or check values — `paddlecloud.jobspec` does, with errors
that name the value.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

CLI, PADDLEJOB, API, SERVER, LOCAL = "job submit", "PaddleJob", "Python API", "Job Server", "local train"
DOORS = (CLI, PADDLEJOB, API, SERVER, LOCAL)

# How a value is written at the doors (the CLI's click type, the CRD's schema, the JSON type):
# text, directory (a local one), choice (one of `choices`), count (an integer >= `minimum`), integer, flag (a bool),
# size (bytes or '64MiB'), paths (a list of strings), pairs (KEY=VALUE), secret_refs
# (NAME=SECRET/KEY), volume (CLAIM:PATH, or {claim, mountPath} in YAML), mapping, template.


class JobSpecError(ValueError):
    """A job spec that cannot run; the message names the bad value and what would be right."""


KINDS = ("text", "directory", "choice", "count", "integer", "flag", "size", "paths", "pairs", "secret_refs",
         "volume", "mapping", "template")


@dataclass(frozen=True)
class Doors:
    """One field at every door. A door whose name is None lists why in `not_at`.

    `flag`: the `job submit` option's parameter (`flag_names` its spellings, default
    `--flag-name`; a `flag_value` makes it a switch that sets the field to that value);
    `paddlejob`: where a PaddleJob gives it (`spec.epochs`); `own`:
    a paddlecloud key of the PaddleJob's spec, translated and schema'd from this entry
    alone (paddle-operator's own keys keep their structure in `paddlecloud.paddlejob`);
    `api`: the Python API's and the Job Server's parameter; `local`: the `local train`
    option that takes it with the same meaning.
    """

    help: str
    kind: str = "text"
    flag: str | None = None
    flag_names: tuple[str, ...] = ()
    flag_value: Any = None
    metavar: str | None = None
    paddlejob: str | None = None
    own: bool = False
    api: str | None = None
    local: str | None = None
    choices: tuple[Any, ...] = ()
    minimum: int | None = None
    not_at: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown field kind {self.kind!r}: one of {', '.join(KINDS)}")
        named = {CLI: self.flag, PADDLEJOB: self.paddlejob, API: self.api, SERVER: self.api,
                 LOCAL: self.local}
        for door, name in named.items():
            if (name is None) == (door in self.not_at):
                continue
            raise ValueError(f"{self.help[:40]!r}: door {door} needs a name or a reason "
                             "in not_at, not both")

    def name_at(self, door: str) -> str | None:
        return {CLI: self.flag, PADDLEJOB: self.paddlejob, API: self.api, SERVER: self.api,
                LOCAL: self.local}[door]

    @property
    def own_key(self) -> str:
        """The key under a PaddleJob's `spec` (only for `own` fields)."""
        return (self.paddlejob or "").removeprefix("spec.")


def job_field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
              repr: bool = True, **doors: Any) -> Any:  # noqa: A002 (dataclasses.field's name)
    """A dataclass field whose metadata is its `Doors`."""
    return field(default=default, default_factory=default_factory, repr=repr,
                 metadata={"doors": Doors(**doors)})


def doors_of(f: dataclasses.Field) -> Doors:
    return f.metadata["doors"]
