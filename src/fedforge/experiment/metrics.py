"""``metrics.jsonl``: one JSON object per evaluation, appended and flushed line by line."""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsWriter:
    """Appends records; on resume keeps only the records of rounds ``<= truncate_after``."""

    def __init__(self, path: Path, truncate_after: int = 0) -> None:
        self.path = path
        self.records: list[dict] = []
        if path.is_file() and truncate_after > 0:
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from a killed run
                if rec.get("round", 0) <= truncate_after:
                    self.records.append(rec)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records), encoding="utf-8")
        os.replace(tmp, path)

    def write(self, record: dict) -> None:
        self.records.append(record)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
