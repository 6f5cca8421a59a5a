"""Print the README's set-up commands, one per line, exactly as written.

They are the lines of the ```bash blocks under the README's "Set-up" heading. CI runs them
as they stand, so a README that stops working on a fresh machine fails CI. Exactly two are
expected: install and run the quickstart, then install the test extras and run the tests.
"""

import re
import sys
from pathlib import Path

readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md").read_text(encoding="utf-8")
section = re.search(r"^## Set-up.*?$(.*?)^## ", readme, flags=re.M | re.S)
if section is None:
    sys.exit("README.md: no '## Set-up' section")
blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), flags=re.M | re.S)
commands = [line for block in blocks for line in block.splitlines() if line.strip()]
if len(commands) != 2:
    sys.exit(f"README.md: expected 2 set-up commands, found {len(commands)}: {commands}")
print("\n".join(commands))
