"""``python -m benchmarks [scenario ...] [--quick] [--processes N] [--against DIR] [--rounds N]``: run the scenarios.

With no scenario named, all of them run, cheapest first (``compare``, which needs
``--against``, only when named).  Every server is a subprocess on
127.0.0.1; every load is bounded in time.  Tables go to stdout, JSON and PNG files to
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

import attrs

from benchmarks.scenarios import Options

SCENARIOS = ("startup", "ceiling", "throughput", "fidelity", "memory")
ON_REQUEST = ("compare", "metrics", "embeddings", "workers", "kv_cache", "paced_cost", "abuse", "soak")
#: Scenarios that live outside benchmarks/scenarios/.
MODULES = {"abuse": "benchmarks.abuse", "soak": "benchmarks.soak"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "scenarios",
        nargs="*",
        metavar="scenario",
        help=f"any of: {', '.join(SCENARIOS + ON_REQUEST)} (default: all but compare)",
    )
    parser.add_argument("--quick", action="store_true", help="short loads: a smoke run, noisier numbers")
    default_processes = attrs.fields(Options).processes.default
    parser.add_argument("--processes", type=int, default=default_processes, help="load-generator worker processes")
    parser.add_argument("--against", type=Path, metavar="DIR", help="compare, paced_cost: another llmsim checkout")
    parser.add_argument("--rounds", type=int, metavar="N", help="paced_cost: interleaved rounds (default 2)")
    args = parser.parse_args()
    known = SCENARIOS + ON_REQUEST
    unknown = sorted(set(args.scenarios) - set(known))
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(known)}")
    options = Options(quick=args.quick, processes=args.processes, against=args.against, rounds=args.rounds)
    for name in args.scenarios or SCENARIOS:
        started = time.perf_counter()
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(MODULES.get(name, f"benchmarks.scenarios.{name}")).run(options)
        print(f"({name}: {time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
