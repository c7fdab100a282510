"""Generates the wide-deep-ps data: text shards in Paddle's MultiSlot format, one record a line.

    python -m examples.wide_deep_ps.data OUT_DIR [--shards 4] [--rows 3200] [--seed 0]

Each line is ``1 <id> 13 <x_1> ... <x_13> 1 <y>``: a categorical id (the wide part, looked up in
an embedding the pservers hold), 13 dense features (the deep part) and the label
``y = w.x + e[id]`` with a fixed ``w`` and ``e``. Only the standard library is used, so the data
can be made with any Python; two runs with one seed write the same bytes.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

VOCAB = 100     # ids 0..VOCAB-1: the embedding's rows, on the pservers
FEATURES = 13


def true_model(seed: int = 0) -> tuple[list[float], list[float]]:
    """The dense weights and the per-id offsets the labels are drawn from."""
    rng = random.Random(seed)
    return [rng.gauss(0, 1) for _ in range(FEATURES)], [rng.gauss(0, 1) for _ in range(VOCAB)]


def generate(out_dir: str | Path, *, shards: int = 4, rows: int = 3200, seed: int = 0) -> list[Path]:
    """Writes ``shards`` files ``part-NNNNN.txt`` of ``rows`` lines each; returns their paths."""
    if shards < 1 or rows < 1:
        raise ValueError(f"need shards >= 1 and rows >= 1, not {shards} and {rows}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights, offsets = true_model(seed)
    paths = []
    for shard in range(shards):
        rng = random.Random(f"{seed}-{shard}")
        lines = []
        for _ in range(rows):
            x = [rng.gauss(0, 1) for _ in range(FEATURES)]
            i = rng.randrange(VOCAB)
            y = sum(a * b for a, b in zip(weights, x, strict=True)) + offsets[i]
            lines.append(f"1 {i} {FEATURES} {' '.join(f'{v:.5f}' for v in x)} 1 {y:.5f}\n")
        path = out / f"part-{shard:05d}.txt"
        path.write_text("".join(lines))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.wide_deep_ps.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rows", type=int, default=3200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = generate(args.out_dir, shards=args.shards, rows=args.rows, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {len(paths)} shards to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
