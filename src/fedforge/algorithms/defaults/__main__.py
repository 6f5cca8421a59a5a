"""``python -m fedforge.algorithms.defaults [PATH]``: write (or print) docs/algorithms.md.

A separate entry point because the factories import the table while ``fedforge.algorithms``
loads; running the table's own module as ``__main__`` would load it a second time.
"""

import sys

from fedforge.algorithms.defaults import main

raise SystemExit(main(sys.argv[1:]))
