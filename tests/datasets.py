"""Small generated datasets for tests: every record carries a unique id."""

from __future__ import annotations

from pathlib import Path


def write_records(directory: Path, *, files: int, records_per_file: int, prefix: str = "part") -> list[Path]:
    """Writes `files` CSV files of `records_per_file` lines `<file>-<line>,<payload>`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = directory / f"{prefix}-{f:05d}.csv"
        path.write_text("".join(f"{f}-{i},{(f * 31 + i) % 97}\n" for i in range(records_per_file)))
        paths.append(path)
    return paths
