"""Human names and units of the metric keys a run logs (axis labels, table headers, TensorBoard).

One registry, so a figure, the HTML report and the console table name a metric the same way,
say which model and which data a number comes from (:attr:`Metric.source`), and cut a band
to what the metric can be (:attr:`Metric.bounds`). A key that is not registered is shown as
itself with underscores turned into spaces, and has no bounds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """``name`` as a reader says it; ``unit`` in brackets after it (None: a pure number).

    ``bounds``: the values the metric can take, ``(low, high)`` with None for no bound (an
    accuracy: ``(0, 1)``); ``source``: which model on which data measured it."""

    name: str
    unit: str | None = None
    higher_is_better: bool | None = None
    wall_clock: bool = False  # measured (or chosen from measurements): differs between two runs
    bounds: tuple[float | None, float | None] | None = None
    source: str | None = None

    @property
    def label(self) -> str:
        return self.name if self.unit is None else f"{self.name} ({self.unit})"

    @property
    def described(self) -> str:
        """The label and, where known, the model and data: ``test accuracy (global model,
        pooled test set)``."""
        return self.label if self.source is None else f"{self.label} ({self.source})"

    def clip(self, value: float) -> float:
        """``value`` cut to :attr:`bounds` (unchanged without them)."""
        low, high = self.bounds or (None, None)
        value = value if low is None else max(low, value)
        return value if high is None else min(high, value)


UNIT = (0.0, 1.0)  # an accuracy or a share
NONNEGATIVE = (0.0, None)  # a loss, a count, seconds
PERPLEXITY = (1.0, None)  # exp of a mean negative log-likelihood
POOLED = "global model, pooled test set"
_PERSONAL_SOURCES = {
    "personal": "personalised model, each client's held-out data",
    "global": "global model, each client's held-out data",
    "held_out_personal": "held-out clients' fine-tuned model, their own held-out data",
    "held_out_global": "global model, held-out clients' own held-out data",
    "prototype": "personalised model's features, nearest global prototype (FedProto)",
    "held_out_prototype": "held-out clients' fine-tuned model's features, nearest global "
                          "prototype (FedProto)"}


METRICS: dict[str, Metric] = {
    "round": Metric("round"),
    "test_accuracy": Metric("test accuracy", None, True, bounds=UNIT, source=POOLED),
    "test_loss": Metric("test loss", None, False, bounds=NONNEGATIVE, source=POOLED),
    # next-token data (docs/finetuning.md): over the scored tokens; accuracy is the token's
    "test_perplexity": Metric("test perplexity", None, False, bounds=PERPLEXITY, source=POOLED),
    "test_tokens": Metric("scored test tokens", None, None, bounds=NONNEGATIVE, source=POOLED),
    "train_loss": Metric("training loss", None, False, bounds=NONNEGATIVE,
                         source="cohort's model, its own training batches"),
    "client_mean_accuracy": Metric("mean accuracy on clients' own test data", None, True,
                                   bounds=UNIT, source="global model, each client's test split"),
    # personalised evaluation (docs/personalised.md): per client on its own test data
    **{f"{who}_accuracy_{stat}": Metric(f"{label} accuracy, {what}", None, True, bounds=UNIT,
                                        source=_PERSONAL_SOURCES[who])
       for who, label in (("personal", "personal"), ("global", "global model's"),
                          ("held_out_personal", "held-out clients' personal"),
                          ("held_out_global", "global model's held-out-client"),
                          ("prototype", "nearest-prototype"),
                          ("held_out_prototype", "held-out clients' nearest-prototype"))
       for stat, what in (("mean", "mean over clients"), ("weighted", "sample-weighted mean"),
                          ("p10", "10th percentile of clients"), ("worst", "worst client"))},
    **{f"{who}_perplexity_{stat}": Metric(f"{label} perplexity, {what}", None, False,
                                          bounds=PERPLEXITY, source=_PERSONAL_SOURCES[who])
       for who, label in (("personal", "personal"), ("global", "global model's"),
                          ("held_out_personal", "held-out clients' personal"),
                          ("held_out_global", "global model's held-out-client"))
       for stat, what in (("mean", "mean over clients"), ("weighted", "sample-weighted mean"),
                          ("p90", "90th percentile of clients"),
                          ("worst", "worst (highest) client"))},
    # one client's numbers (client_metrics.npz): the columns the summaries above are taken over
    "personal_accuracy": Metric("personal accuracy", None, True, bounds=UNIT,
                                source=_PERSONAL_SOURCES["personal"]),
    "global_accuracy": Metric("global model's accuracy", None, True, bounds=UNIT,
                              source=_PERSONAL_SOURCES["global"]),
    "prototype_accuracy": Metric("nearest-prototype accuracy", None, True, bounds=UNIT,
                                 source=_PERSONAL_SOURCES["prototype"]),
    "personal_perplexity": Metric("personal perplexity", None, False, bounds=PERPLEXITY,
                                  source=_PERSONAL_SOURCES["personal"]),
    "global_perplexity": Metric("global model's perplexity", None, False, bounds=PERPLEXITY,
                                source=_PERSONAL_SOURCES["global"]),
    "personal_loss": Metric("personal loss", None, False, bounds=NONNEGATIVE,
                            source=_PERSONAL_SOURCES["personal"]),
    "global_loss": Metric("global model's loss", None, False, bounds=NONNEGATIVE,
                          source=_PERSONAL_SOURCES["global"]),
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
    "final_acc": Metric("final test accuracy", None, True, bounds=UNIT, source=POOLED),
    "best_acc": Metric("best test accuracy", None, True, bounds=UNIT, source=POOLED),
    "final_loss": Metric("final test loss", None, False, bounds=NONNEGATIVE, source=POOLED),
    "sim_s_per_round": Metric("simulated time per round", "s"),
}


def metric(key: str) -> Metric:
    """The registered metric, or one named after the key."""
    if key in METRICS:
        return METRICS[key]
    if key.startswith("final_") and key.removeprefix("final_") in METRICS:
        inner = METRICS[key.removeprefix("final_")]
        return Metric(f"final {inner.name}", inner.unit, inner.higher_is_better,
                      bounds=inner.bounds, source=inner.source)
    if key.startswith("worst10_") and key.removeprefix("worst10_") in METRICS:
        inner = METRICS[key.removeprefix("worst10_")]
        return Metric(f"{inner.name}, mean of the worst 10 % of clients",
                      inner.unit, inner.higher_is_better, bounds=inner.bounds,
                      source=inner.source)
    if key.startswith("rank_by_"):
        inner = metric(key.removeprefix("rank_by_"))
        return Metric(f"rank by {inner.name}", None, False)
    if key.startswith("vs_"):
        return Metric(f"minus {key.removeprefix('vs_')}, paired")
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
