"""Generates the fit-a-line data: CSV shards of a noisy linear regression problem.

    python -m examples.fit_a_line.data OUT_DIR [--shards 4] [--rows 5000] [--seed 0]

Each line is ``x_1,...,x_13,y`` with ``y = w.x + b + noise`` (noise ~ N(0, 0.5^2), so
the best mean squared error is about 0.25). The features are normal with standard
deviations from 0.1 to 2, unnormalized as real features often are, so the small ones
take a few epochs to learn and the loss keeps falling for a while. The weights, the
bias and every row follow from ``--seed`` alone: two runs write the same bytes. The
default writes about 2.7 MB (4 shards of 5000 rows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

FEATURES = 13
NOISE = 0.5


def true_model(seed: int = 0, features: int = FEATURES) -> tuple[np.ndarray, float, np.ndarray]:
    """The weights, bias and feature scales the data is drawn from."""
    rng = np.random.default_rng([seed, 0])
    scales = rng.permutation(np.geomspace(0.1, 2.0, features))
    return rng.uniform(-2.0, 2.0, size=features), float(rng.uniform(-1.0, 1.0)), scales


def generate(out_dir: str | Path, *, shards: int = 4, rows: int = 5000, seed: int = 0,
             features: int = FEATURES) -> list[Path]:
    """Writes ``shards`` files ``part-NNNNN.csv`` of ``rows`` lines each; returns their paths."""
    if shards < 1 or rows < 1:
        raise ValueError(f"need shards >= 1 and rows >= 1, not {shards} and {rows}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights, bias, scales = true_model(seed, features)
    paths = []
    for shard in range(shards):
        rng = np.random.default_rng([seed, shard + 1])
        x = rng.standard_normal((rows, features)) * scales
        y = x @ weights + bias + rng.normal(0.0, NOISE, size=rows)
        table = np.column_stack([x, y])
        path = out / f"part-{shard:05d}.csv"
        tmp = path.with_suffix(".csv.tmp")
        np.savetxt(tmp, table, fmt="%.6f", delimiter=",")
        tmp.replace(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.fit_a_line.data",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000, help="rows per shard")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = generate(args.out_dir, shards=args.shards, rows=args.rows, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} shards, {args.shards * args.rows} rows, {size / 1e6:.1f} MB "
          f"to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
