"""The job server's configuration: limits, quotas, the store, tokens, the image builder,
and what a request may not choose (the masters' image, the etcd endpoints).

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

from paddlecloud.backends.k8s.image_build import BuildConfig
from paddlecloud.jobspec import DEFAULT_ETCD_ENDPOINTS, DEFAULT_IMAGE

logger = logging.getLogger(__name__)


MULTIPART_SLACK = 64 * 1024  # room for the multipart frame around an upload


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the value."""


@dataclass(frozen=True)
class Limits:
    """What one upload may be: the archive, and what it unpacks to (a zip bomb stops here)."""

    max_upload_bytes: int = 64 * 1024 * 1024
    max_unpacked_bytes: int = 256 * 1024 * 1024  # headers and padding count too
    max_files: int = 10_000  # entries: folders count too


@dataclass(frozen=True)
class Quotas:
    """Per job in every namespace, checked before anything is created (0: no limit). On by
    default: a token may not ask for a million trainers or a thousand GPUs (issue 34)."""

    max_gpus_per_job: int = 64
    max_trainers_per_job: int = 256


@dataclass(frozen=True)
class ServerConfig:
    store: str = "./paddlecloud-packages"  # a path or any fsspec URL
    tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)
    limits: Limits = Limits()
    quotas: Quotas = Quotas()
    build: BuildConfig | None = None  # None: packages ship in a ConfigMap, as `job submit`'s
    paddlejobs: bool = False  # True where the operator runs: jobs go in as PaddleJobs
    # The masters' image: paddlecloud's, never a request's base_image (a master holds the
    # namespace's etcd and scaler credentials). The server's own image is the natural one.
    paddlecloud_image: str = DEFAULT_IMAGE
    # The etcd endpoints a job may name (the first: when it names none); any other is
    # refused, so a master holding etcd credentials never dials a submitter's address.
    etcd_endpoints: tuple[str, ...] = (DEFAULT_ETCD_ENDPOINTS,)
    behind_tls_proxy: bool = False  # served over https by a proxy: cookies get Secure


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
    known = sorted({"store", "limits", "quotas", "build", "tokens_file", "paddlejobs",
                    "paddlecloud_image", "etcd_endpoints", "behind_tls_proxy"})
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]}: known are {', '.join(known)}")
    tokens_path = tokens_file or raw.get("tokens_file")
    return ServerConfig(
        store=str(raw.get("store") or ServerConfig.store),
        tokens=load_tokens(tokens_path) if tokens_path else {},
        limits=_section(Limits, raw.get("limits"), key="limits") or Limits(),
        quotas=_section(Quotas, raw.get("quotas"), key="quotas") or Quotas(),
        build=_section(BuildConfig, raw.get("build"), key="build"),
        paddlejobs=_flag(raw.get("paddlejobs", False), key="paddlejobs"),
        paddlecloud_image=_image(raw.get("paddlecloud_image", DEFAULT_IMAGE), key="paddlecloud_image"),
        etcd_endpoints=_endpoints(raw.get("etcd_endpoints", [DEFAULT_ETCD_ENDPOINTS]),
                                  key="etcd_endpoints"),
        behind_tls_proxy=_flag(raw.get("behind_tls_proxy", False), key="behind_tls_proxy"),
    )


def _image(value: Any, *, key: str) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ConfigError(f"config key {key}: expected an image reference, got {value!r}")
    return value


def _endpoints(value: Any, *, key: str) -> tuple[str, ...]:
    """One endpoints string (`https://etcd-0:2379,https://etcd-1:2379`) or a list of them."""
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not listed or not all(
            isinstance(v, str) and v.strip() for v in listed):
        raise ConfigError(f"config key {key}: expected an endpoints string or a list of them, "
                          f"got {value!r}")
    return tuple(v.strip() for v in listed)


def _flag(value: Any, *, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config key {key}: expected true or false, got {value!r}")
    return value
