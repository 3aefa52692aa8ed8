"""Parses the command line at import time, as some scripts do: argparse exits (status 2)."""

from __future__ import annotations

import argparse

_parser = argparse.ArgumentParser(prog="exits_at_import")
_parser.add_argument("--required-flag", required=True)
_parser.parse_args()
