"""Command line: run one load against a server on 127.0.0.1 and print its summary as JSON.

python -m benchmarks.loadgen --port 8000 --http2 -c 20 -m 50 -d 10 --processes 2
"""

from __future__ import annotations

import argparse
import json
import sys

import attrs

from benchmarks.loadgen.runner import LoadSpec, run_load
from benchmarks.loadgen.stats import summarize


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http2", action="store_true", help="h2c with prior knowledge (default HTTP/1.1)")
    parser.add_argument("-c", "--connections", type=int, default=10)
    parser.add_argument("-m", "--streams", type=int, default=1, help="concurrent streams per HTTP/2 connection")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the statistics")
    parser.add_argument("--ramp", type=float, default=0.0, help="seconds over which the first streams start")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--processes", type=int, default=1, help="worker processes sharing the connections")
    args = parser.parse_args()
    spec = LoadSpec(
        port=args.port,
        http2=args.http2,
        connections=args.connections,
        streams=args.streams,
        duration=args.duration,
        warmup=args.warmup,
        ramp=args.ramp,
        max_tokens=args.max_tokens,
        model=args.model,
        processes=args.processes,
    )
    summary = summarize(run_load(spec))
    json.dump(attrs.asdict(summary), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
