"""`python -m bench list` and `python -m bench run NAME [--quick] [--out DIR] [--no-record]
[-- the bench's own arguments]`: bench/harness.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.harness import BENCHES, listing, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every benchmark: what it measures, how long it takes")
    one = commands.add_parser(
        "run",
        help="run one benchmark",
        description="Run one benchmark; arguments after NAME (or after --) are its own.",
    )
    one.add_argument("name", choices=sorted(BENCHES), metavar="NAME")
    one.add_argument("--quick", action="store_true", help="its quick mode: a look, in minutes")
    one.add_argument(
        "--out", type=Path, help="where its records go (default bench/results); nothing else"
    )
    one.add_argument("--no-record", action="store_true", help="record nothing")
    args, own = parser.parse_known_args(argv)
    if args.command == "list":
        print(listing())
        return 0
    own = [a for a in own if a != "--"]
    return run(args.name, own, quick=args.quick, out=args.out, record=not args.no_record)


if __name__ == "__main__":
    sys.exit(main())
