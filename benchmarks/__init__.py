"""Performance harness for Normandy: the hot path, compaction, counting, and the peers.

Run ``python -m benchmarks --quick`` (under a minute) or ``python -m benchmarks --full``.
Every figure is a median of repeated runs; every comparison is a ratio measured in the
same run. See ``benchmarks/README.md``.
"""
