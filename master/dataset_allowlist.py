"""Which dataset paths a `SetDataset` caller may make the master list: the
`--allow-set-dataset` prefixes, compared on what a path means, never on how it is spelled.

A string prefix admitted far too much: `/allowed` admitted `/allowedX/`,
`http://localhost` admitted `http://localhost@127.0.0.1:PORT/` (the host is after the
`@`), a percent-encoded `..` (`/data/%2e%2e/`) walked out of an allowed URL once the
server decoded it, and a symlink inside an allowed directory listed `/etc`. So:

* a URL is parsed: its scheme and host (lowercased) and port (the scheme's default
  filled in) must equal the prefix's (a prefix without a host, `hdfs://`, admits any
  host of its scheme); user information (`user@host`) and chained fsspec URLs
  (`a::b`) are refused outright; its path is percent-decoded (until nothing changes,
  so `%252e` is caught too), `\\` read as `/`, and a `..` segment refused;
* a local path (or `file://`) must be absolute and hold no `..`; it and the prefix
  are compared with their symlinks resolved (`os.path.realpath`);
* a prefix admits its own path and what lies below it by whole components: `/data`
  and `/data/` admit `/data/x.csv`, never `/dataX/x.csv`;
* after the listing, every file listed is checked again the same way (`check_listed`),
  before anything is frozen: a glob or a directory that reaches through a symlink (or
  an HTTP index that links to another host) is refused as a whole.

Refusals are `NotAllowed` (a ValueError) naming the path and the prefixes.

What this does NOT do: stop a file from changing after it was listed (a symlink swapped
later is read by the trainers as it is then); the master itself only lists names and sizes.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from paddlecloud.untrusted import quote

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_DECODINGS = 8  # rounds of percent-decoding before a path is called too deeply encoded


class NotAllowed(ValueError):
    """A dataset path outside the allowed prefixes, or one that cannot be read safely."""


@dataclass(frozen=True)
class Location:
    """What a path or a prefix names: `scheme` '' for a local path; `host` '' for any
    (a prefix) or none; `path` normalized, without a trailing '/' ('' is the root)."""

    scheme: str
    host: str
    port: int | None
    path: str

    def admits(self, other: Location) -> bool:
        if self.scheme != other.scheme:
            return False
        if self.host and (self.host, self.port) != (other.host, other.port):
            return False
        return not self.path or other.path == self.path or other.path.startswith(self.path + "/")


def _decoded(text: str) -> str:
    for _ in range(MAX_DECODINGS):
        decoded = unquote(text)
        if decoded == text:
            return text
        text = decoded
    raise NotAllowed(f"dataset path {quote(text)} is percent-encoded more than {MAX_DECODINGS} times")


def _normal_path(path: str, original: str) -> str:
    segments = path.replace("\\", "/").split("/")
    if ".." in segments:
        raise NotAllowed(f"dataset path {quote(original)} holds '..'")
    return posixpath.normpath("/" + path.replace("\\", "/")).rstrip("/") if path.strip("/") else ""


def locate(text: str, *, resolve: bool = True) -> Location:
    """The location `text` names; `resolve`: a local path's symlinks resolved (as they are now)."""
    if "::" in text:
        raise NotAllowed(f"dataset path {quote(text)} is a chained fsspec URL ('::'): not accepted "
                         "by SetDataset")
    if "://" not in text or text.startswith("file://"):
        local = text[len("file://"):] if text.startswith("file://") else text
        if not local.startswith("/"):
            raise NotAllowed(f"dataset path {quote(text)} is not absolute")
        path = _normal_path(local, text)
        if resolve:
            path = os.path.realpath(path or "/").rstrip("/")
        return Location("", "", None, path)
    url = urlsplit(text)
    if "@" in url.netloc:
        raise NotAllowed(f"dataset URL {quote(text)} holds user information ('@'): not accepted")
    try:
        port = url.port
    except ValueError:
        raise NotAllowed(f"dataset URL {quote(text)} has a bad port") from None
    scheme = url.scheme.lower()
    return Location(scheme, (url.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme),
                    _normal_path(_decoded(url.path), text))


class AllowList:
    """The master's `--allow-set-dataset` prefixes; an empty list allows nothing."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes = tuple(prefixes)
        for prefix in self.prefixes:
            locate(prefix, resolve=False)  # a bad prefix fails the master's start

    def check(self, path: str) -> None:
        """Raises NotAllowed unless `path` lies under one of the prefixes."""
        where = locate(path)
        if not any(locate(prefix).admits(where) for prefix in self.prefixes):
            raise NotAllowed(f"dataset path {quote(path)} is not under an allowed prefix "
                             f"({', '.join(self.prefixes)})")

    def check_listed(self, requested: str, listed: Iterable[str]) -> None:
        """Raises NotAllowed when a file that `requested` listed lies outside the prefixes."""
        for path in listed:
            try:
                self.check(path)
            except NotAllowed:
                raise NotAllowed(f"dataset path {quote(requested)} reaches {quote(path, limit=256)}, which is not "
                                 f"under an allowed prefix ({', '.join(self.prefixes)})") from None
