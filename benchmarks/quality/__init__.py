"""The quality benchmark (issue 16): are the facts a later turn needs still available?

:mod:`benchmarks.quality.sessions` holds the sessions (generated and recorded, with
planted facts and the calls that need them; importable by other benchmarks),
:mod:`benchmarks.quality.replay` replays one through the turn loop (or a peer's
trimming) and measures, :mod:`benchmarks.quality.run` is the command
(``python -m benchmarks.quality``, ``make bench-quality``).
"""
