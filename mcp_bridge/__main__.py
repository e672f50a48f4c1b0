"""`python -m qmd.mcp_bridge [--index NAME]`: the same bridge as `qmd mcp`, without click."""

from __future__ import annotations

import argparse
import sys

from qmd.mcp_bridge.bridge import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m qmd.mcp_bridge", description=__doc__)
    parser.add_argument("--index", default=None, metavar="NAME", help="Use a named index (own config and database).")
    sys.exit(main(parser.parse_args().index))
