"""Triton kernels for the samplers' hot paths, each behind an op whose torch reference the samplers share.

Ops (each the decorated torch reference; :mod:`vgen.kernels.dispatch` picks the side):

- ``vgen.samplers.logits.target_probs``: CFG merge, temperature, top-k, top-p and softmax of a whole window
  (kernel: :mod:`vgen.kernels.probs`);
- ``vgen.samplers.speculative.rules.accept_drafts``: the acceptance test of exact, LANTERN, GSD and exact-match
  verification with the accepted length per sample (:mod:`vgen.kernels.accept`);
- ``vgen.samplers.speculative.rules.recover``: the residual distribution at the first rejection and the recovered
  token drawn from it with given uniforms (:mod:`vgen.kernels.residual`).

The kernels are leaf ops: they import nothing else of vgen, and take what they need from an acceptance rule or
the sampling settings as a spec of plain values (:class:`RuleSpec`, :class:`SamplingSpec`). Importing this package
does not import triton; the kernel modules load on first use.
"""

from vgen.kernels.dispatch import BACKENDS, load_interpreted, triton_available, use_backend
from vgen.kernels.spec import RULE_KINDS, TINY, RuleSpec, SamplingSpec

__all__ = ["BACKENDS", "RULE_KINDS", "TINY", "RuleSpec", "SamplingSpec", "load_interpreted", "triton_available",
           "use_backend"]
