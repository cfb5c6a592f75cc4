"""llmsim's benchmark suite: a load generator of our own, a baseline server and scenarios.

Run ``python -m benchmarks`` (all scenarios) or ``python -m benchmarks throughput``; see
docs/benchmarks.md.  Nothing here is imported by llmsim itself.
"""
