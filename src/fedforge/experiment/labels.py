"""Human names and units of the metric keys a run logs (axis labels, table headers, TensorBoard).

One registry, so a figure, the HTML report and the console table name a metric the same way.
A key that is not registered is shown as itself with underscores turned into spaces.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """``name`` as a reader says it; ``unit`` in brackets after it (None: a pure number)."""

    name: str
    unit: str | None = None
    higher_is_better: bool | None = None
    wall_clock: bool = False  # measured (or chosen from measurements): differs between two runs

    @property
    def label(self) -> str:
        return self.name if self.unit is None else f"{self.name} ({self.unit})"


METRICS: dict[str, Metric] = {
    "round": Metric("round"),
    "test_accuracy": Metric("test accuracy", None, True),
    "test_loss": Metric("test loss", None, False),
    "train_loss": Metric("training loss", None, False),
    "client_mean_accuracy": Metric("mean accuracy on clients' own test data", None, True),
    # personalised evaluation (docs/personalised.md): per client on its own test data
    **{f"{who}_accuracy_{stat}": Metric(f"{label} accuracy, {what}", None, True)
       for who, label in (("personal", "personal"), ("global", "global model's"),
                          ("held_out_personal", "held-out clients' personal"),
                          ("held_out_global", "global model's held-out-client"))
       for stat, what in (("mean", "mean over clients"), ("weighted", "sample-weighted mean"),
                          ("p10", "10th percentile of clients"), ("worst", "worst client"))},
    "sim_time_s": Metric("simulated time", "s"),
    "wall_s": Metric("wall-clock time", "s", wall_clock=True),
    "prep_s": Metric("preparation time", "s", wall_clock=True),
    "server_prep_s": Metric("server preparation time", "s", wall_clock=True),
    "fedptr_mtt_s": Metric("FedPTR trajectory-matching time", "s", wall_clock=True),
    "fedptr_proj_s": Metric("FedPTR projection time", "s", wall_clock=True),
    "engine_auto_calibration_s": Metric("engine calibration time", "s", wall_clock=True),
    # the engine auto picked depends on the machine's timings, not on the run's maths
    "engine_auto": Metric("engine chosen by auto", wall_clock=True),
    "engine_auto_ms": Metric("engine candidates' ms per client update", wall_clock=True),
    "engine_auto_reason": Metric("why auto did not calibrate", wall_clock=True),
    # engine.client_store = auto: memory or disk, from the machine's free memory
    "client_store_auto": Metric("client store chosen by auto", wall_clock=True),
    # procs: its worker count follows the machine's CPUs (and may fall back to one process)
    "engine_procs_workers": Metric("engine worker processes", wall_clock=True),
    "engine_procs_inner": Metric("engine each worker runs", wall_clock=True),
    "engine_procs_fallback": Metric("why procs ran in one process", wall_clock=True),
    "dp_epsilon": Metric("privacy spent ε (at the run's δ)", None, False),
    "dp_noise_multiplier": Metric("noise multiplier σ"),
    "bytes_up": Metric("bytes up, cumulative", "B"),
    "bytes_down": Metric("bytes down, cumulative", "B"),
    "bytes_up_round": Metric("bytes up per round", "B"),
    "bytes_down_round": Metric("bytes down per round", "B"),
    "client_state_bytes_per_client": Metric("client state per client", "B"),
    "updates": Metric("server updates"),
    # compare's table columns
    "final_acc": Metric("final test accuracy", None, True),
    "best_acc": Metric("best test accuracy", None, True),
    "final_loss": Metric("final test loss", None, False),
    "sim_s_per_round": Metric("simulated time per round", "s"),
}


def metric(key: str) -> Metric:
    """The registered metric, or one named after the key."""
    if key in METRICS:
        return METRICS[key]
    if key.startswith("rounds_to_"):
        return Metric(f"rounds to accuracy {key.removeprefix('rounds_to_')}", None, False)
    if key.startswith("sim_min_to_"):
        return Metric(f"simulated time to accuracy {key.removeprefix('sim_min_to_')}", "min",
                      False)
    return Metric(key.replace("_", " "))


def without_wall_clock(record: dict) -> dict:
    """The record minus measured seconds: what two runs of one config must agree on."""
    return {k: v for k, v in record.items() if not metric(k).wall_clock}


def axis_label(key: str) -> str:
    """``"simulated time (s)"`` for ``sim_time_s``; the key itself, spaced, if unknown."""
    return metric(key).label
