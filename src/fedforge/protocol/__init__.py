"""The algorithm protocol: what an algorithm declares (its parts, the local step's batch) and
what the engine reads from it. Below both the engine and the algorithms, so neither names the
other."""
