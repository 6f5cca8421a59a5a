"""The ``[privacy]`` section of a run config (validated on load, like every other section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MODES = ("off", "central", "local", "sample")


class PrivacyConfig(BaseModel):
    """Differential privacy of a run (see ``docs/privacy.md``).

    * ``mode``: ``off``; ``central`` (client-level DP, trusted server: deltas clipped to
      ``clip``, Gaussian noise ``N(0, σ²C²)`` on their sum); ``local`` (each client noises its
      own clipped delta before upload); ``sample`` (DP-SGD in local training: per-sample
      gradients clipped to ``clip``, noise per step).
    * ``noise_multiplier`` σ, or ``target_epsilon`` alone to choose σ for the run's rounds;
      with both, the run stops at the last round whose ε stays within ``target_epsilon``.
    * ``adaptive`` (central only): the clip follows the ``target_quantile`` of the clients'
      update norms (Andrew et al. 2021), ``C <- C exp(-clip_lr (b̃ - γ))``, where b̃ is the
      fraction of unclipped clients counted with noise std ``count_noise``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: Literal["off", "central", "local", "sample"] = "off"  # who is protected, from whom
    clip: float = Field(default=1.0, gt=0.0)  # C: L2 bound of an update (or an example's grad)
    noise_multiplier: float | None = Field(default=None, ge=0.0)  # σ: noise std is σC
    target_epsilon: float | None = Field(default=None, gt=0.0)  # chooses σ, or stops the run
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)  # δ of the reported ε(δ)
    accountant: Literal["rdp", "pld"] = "rdp"  # dp-accounting: Rényi DP or PLD
    adaptive: bool = False  # central: the clip tracks a quantile of the update norms
    target_quantile: float = Field(default=0.5, gt=0.0, lt=1.0)  # γ: unclipped fraction
    clip_lr: float = Field(default=0.2, gt=0.0)  # η_C: C <- C exp(-η_C (b̃ - γ))
    count_noise: float | None = Field(default=None, gt=0.0)  # σ_b; default: qN / 20

    @model_validator(mode="after")
    def _consistent(self):
        if self.mode == "off":
            return self
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("set noise_multiplier or target_epsilon (or mode = \"off\")")
        if self.noise_multiplier == 0 and self.target_epsilon is not None:
            raise ValueError(f"noise_multiplier = 0 adds no noise, so not one round stays "
                             f"within target_epsilon = {self.target_epsilon}; raise "
                             f"noise_multiplier or leave it out to choose it for the target")
        if self.adaptive and self.mode != "central":
            raise ValueError("adaptive = true: adaptive clipping is for mode 'central' only")
        return self

    @property
    def on(self) -> bool:
        return self.mode != "off"
