"""Speculative decoding for discrete visual tokens: drafter x acceptance rule, one verify loop.

Importing this package registers the rules (exact, lantern, gsd, match), the drafters (jacobi, head, neighbour) and
the samplers ``speculative``, ``sjd``, ``mcsjd``, ``lantern`` and ``gsd``.
"""

from vgen.samplers.speculative import exact, grouped, head, lantern, match, neighbour  # noqa: F401  (register them)
from vgen.samplers.speculative.drafters import Drafter, JacobiDrafter, Verification, available_drafters
from vgen.samplers.speculative.rules import AcceptanceRule, available_rules
from vgen.samplers.speculative.sampler import GSD, MCSJD, SJD, Lantern, Speculative

__all__ = ["GSD", "MCSJD", "SJD", "AcceptanceRule", "Drafter", "JacobiDrafter", "Lantern", "Speculative",
           "Verification", "available_drafters", "available_rules"]
