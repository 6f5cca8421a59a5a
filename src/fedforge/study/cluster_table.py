"""The clients per cluster over the evaluated rounds of a clustered run (IFCA, CFL), as the
HTML table ``fedforge report`` shows: one row per evaluated round, one column per cluster
that ever held a client, from the ``cluster_size_j`` metrics."""

from __future__ import annotations

import html
import re

SIZE = re.compile(r"^cluster_size_(\d+)$")


def cluster_sizes(records: list[dict]) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """-> (the clusters that ever held a client, ``(round, size of each)`` per evaluated
    round); empty for a run without clusters."""
    keys = {int(m.group(1)): k for r in records for k in r if (m := SIZE.match(k))}
    used = sorted(j for j, k in keys.items() if any(r.get(k, 0) > 0 for r in records))
    rows = [(int(r["round"]), [int(r.get(keys[j], 0)) for j in used])
            for r in records if any(keys[j] in r for j in used)]
    return used, rows


def cluster_table(method: str, records: list[dict]) -> str:
    """The HTML table of one run's cluster sizes, or '' for a run without clusters."""
    used, rows = cluster_sizes(records)
    if not rows:
        return ""
    head = "".join(f"<th>cluster {j}</th>" for j in used)
    body = "".join("<tr>" + f"<td>{t}</td>" + "".join(f"<td>{n}</td>" for n in sizes) + "</tr>"
                   for t, sizes in rows)
    return (f"<p>{html.escape(method)}: clients per cluster at each evaluated round</p>"
            f'<table class="clusters"><tr><th>round</th>{head}</tr>{body}</table>')
