"""The job server's configuration: limits, quotas, the store, tokens and the image builder.

One YAML file (`paddlecloud server --config`), every key optional; tokens come from
their own file (a mounted Secret), `TOKEN: [namespace, ...]`, so rotating them
touches no other setting.

What this does NOT guarantee: tokens are compared as given (constant-time), not
hashed at rest — keep the file in a Secret.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from paddlecloud.k8s.image_build import BuildConfig

logger = logging.getLogger(__name__)


MULTIPART_SLACK = 64 * 1024  # room for the multipart frame around an upload


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the value."""


@dataclass(frozen=True)
class Limits:
    """What one upload may be: the archive, and what it unpacks to (a zip bomb stops here)."""

    max_upload_bytes: int = 64 * 1024 * 1024
    max_unpacked_bytes: int = 256 * 1024 * 1024
    max_files: int = 10_000


@dataclass(frozen=True)
class Quotas:
    """Per job, checked before anything is created (0: no limit)."""

    max_gpus_per_job: int = 0
    max_trainers_per_job: int = 0


@dataclass(frozen=True)
class ServerConfig:
    store: str = "./paddlecloud-packages"  # a path or any fsspec URL
    tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)
    limits: Limits = Limits()
    quotas: Quotas = Quotas()
    build: BuildConfig | None = None  # None: packages ship in a ConfigMap, as `job submit`'s
    paddlejobs: bool = False  # True where the operator runs: jobs go in as PaddleJobs


def load_tokens(path: str) -> dict[str, tuple[str, ...]]:
    """`TOKEN: [namespace, ...]` from a YAML file."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the tokens file {path}: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"tokens file {path}: expected a mapping TOKEN: [namespace, ...]")
    tokens: dict[str, tuple[str, ...]] = {}
    for number, (token, namespaces) in enumerate(raw.items(), start=1):
        if isinstance(namespaces, str):
            namespaces = [namespaces]
        if not isinstance(namespaces, list) or not namespaces or not all(
                isinstance(n, str) and n for n in namespaces):
            raise ConfigError(f"tokens file {path}: token number {number} needs a list of "
                              f"namespaces, got {namespaces!r}")
        tokens[str(token)] = tuple(namespaces)
    return tokens


def _section(cls: type, raw: Any, *, key: str) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"config key {key}: expected a mapping, got {raw!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown config key {key}.{unknown[0]}: known are {', '.join(sorted(known))}")
    try:
        return cls(**raw)
    except (TypeError, ValueError) as error:  # a section's own checks (e.g. build.timeout_s)
        raise ConfigError(f"config key {key}: {error}") from None


def load_config(path: str | None, *, tokens_file: str | None = None) -> ServerConfig:
    """The configuration of a YAML file (None: the defaults) plus the tokens file."""
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"cannot read the config file {path}: {error}") from None
    unknown = sorted(set(raw) - {"store", "limits", "quotas", "build", "tokens_file", "paddlejobs"})
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]}: known are build, limits, "
                          "paddlejobs, quotas, store, tokens_file")
    tokens_path = tokens_file or raw.get("tokens_file")
    return ServerConfig(
        store=str(raw.get("store") or ServerConfig.store),
        tokens=load_tokens(tokens_path) if tokens_path else {},
        limits=_section(Limits, raw.get("limits"), key="limits") or Limits(),
        quotas=_section(Quotas, raw.get("quotas"), key="quotas") or Quotas(),
        build=_section(BuildConfig, raw.get("build"), key="build"),
        paddlejobs=_flag(raw.get("paddlejobs", False), key="paddlejobs"),
    )


def _flag(value: Any, *, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config key {key}: expected true or false, got {value!r}")
    return value
