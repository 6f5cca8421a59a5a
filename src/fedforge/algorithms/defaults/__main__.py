"""``python -m fedforge.algorithms.defaults [PATH]``: write (or print) docs/algorithms.md.

The page lists every method with its kind, which needs the registry, so the writer is
``fedforge.algorithms.methods``; the table's own module stays free of it.
"""

import sys

from fedforge.algorithms.methods import main

raise SystemExit(main(sys.argv[1:]))
