"""``python -m benchmarks [scenario ...] [--quick] [--processes N]``: run the scenarios.

With no scenario named, all of them run, cheapest first.  Every server is a subprocess on
127.0.0.1; every load is bounded in time.  Tables go to stdout, JSON and PNG files to
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib
import time

import attrs

from benchmarks.scenarios import Options

SCENARIOS = ("startup", "ceiling", "throughput", "fidelity", "memory")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "scenarios", nargs="*", metavar="scenario", help=f"any of: {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="short loads: a smoke run, noisier numbers")
    default_processes = attrs.fields(Options).processes.default
    parser.add_argument("--processes", type=int, default=default_processes, help="load-generator worker processes")
    args = parser.parse_args()
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    options = Options(quick=args.quick, processes=args.processes)
    for name in args.scenarios or SCENARIOS:
        started = time.perf_counter()
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"benchmarks.scenarios.{name}").run(options)
        print(f"({name}: {time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
