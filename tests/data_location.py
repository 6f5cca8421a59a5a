"""Where the tests find real datasets: the tests' own setting, not the library's.

``$FEDFORGE_TEST_DATA``, else the ``data`` folder of a ``shared`` folder beside the
repository (where CI keeps them). Tests that need a dataset that is not there skip with a
reason. The library itself knows no such folder.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = Path(os.environ.get("FEDFORGE_TEST_DATA", REPO.parent / "shared" / "data"))
