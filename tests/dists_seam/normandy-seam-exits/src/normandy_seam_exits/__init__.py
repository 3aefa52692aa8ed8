"""Compactors that raise SystemExit or KeyboardInterrupt, at import or mid-compaction."""
