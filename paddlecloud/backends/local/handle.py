"""A running local job's handle in its output directory, for `paddlecloud job scale --output`.

`paddlecloud local train` writes OUTPUT/.paddlecloud/job.json beside the job's tokens
(the directory is the user's only, mode 0700): the job's name, its masters' addresses and
the leader it saw last, and removes it when the job ends. With it, scaling a local job
needs neither the leader's address from the log nor the operator token's path: both are
in the output directory the user already named.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

SECRETS_DIR = ".paddlecloud"   # OUTPUT/.paddlecloud: this run's tokens (and certificates)
HANDLE_FILE = "job.json"


class NoLocalJob(ValueError):
    """The output directory holds no running local job."""


@dataclass(frozen=True)
class LocalJobHandle:
    job: str
    masters: tuple[str, ...]   # every master's HOST:PORT
    leader: str = ""           # the leader the supervisor saw last ("" before one led)

    @staticmethod
    def path(output: Path) -> Path:
        return output / SECRETS_DIR / HANDLE_FILE

    def write(self, output: Path) -> None:
        """Replaces the handle whole (a reader never sees half of one)."""
        path = self.path(output)
        partial = path.with_name(f".{HANDLE_FILE}.partial")
        partial.write_text(json.dumps({"job": self.job, "masters": list(self.masters), "leader": self.leader}))
        os.replace(partial, path)

    @classmethod
    def read(cls, output: Path) -> LocalJobHandle:
        path = cls.path(output)
        try:
            data = json.loads(path.read_text())
            return cls(job=str(data["job"]), masters=tuple(map(str, data["masters"])),
                       leader=str(data.get("leader", "")))
        except FileNotFoundError:
            raise NoLocalJob(f"no local job runs with --output {str(output)[:200]} (no {path.name} in "
                             f"{path.parent}: it is written while `paddlecloud local train --output "
                             f"{str(output)[:200]}` runs)") from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise NoLocalJob(f"cannot read {str(path)[:200]}: {error}") from None

    @staticmethod
    def remove(output: Path) -> None:
        LocalJobHandle.path(output).unlink(missing_ok=True)

    def addresses(self) -> list[str]:
        """The masters to ask, the last known leader first."""
        return list(dict.fromkeys([a for a in (self.leader, *self.masters) if a]))


def operator_token(output: Path) -> str:
    return (output / SECRETS_DIR / "tokens" / "operator").read_text().strip()


def master_ca(output: Path) -> bytes | None:
    """The CA of a `--tls` run's masters; None for plaintext masters."""
    path = output / SECRETS_DIR / "ca.crt"
    return path.read_bytes() if path.exists() else None
