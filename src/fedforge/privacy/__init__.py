"""Differential privacy for fedforge runs (``[privacy]``; ``docs/privacy.md``).

Client-level DP with a trusted server (``central``, McMahan et al. 2018, with adaptive
clipping from Andrew et al. 2021), local DP (``local``) and sample-level DP-SGD in local
training (``sample``); ε(δ) from ``dp-accounting`` (RDP or PLD). The mechanisms and the
accountant live in :mod:`fedforge.privacy.algorithm` (imported only by private runs, as it
needs the ``privacy`` extra).
"""

from fedforge.privacy.config import PrivacyConfig

__all__ = ["PrivacyConfig"]
