"""The draft-head drafter: a trained EAGLE-style head drafts the window one token at a time.

After each target pass the head reads the target's features at the window positions that were kept (plus the
recovered / bonus token) into its own KV cache; the feature it predicts after the last of them gives the draft
distribution of the next token. ``propose`` then drafts autoregressively: sample a draft from ``q`` (formed
exactly as the target's ``p``: guidance over the [cond; null] rows, temperature, top-k, top-p), feed it back,
predict the next feature. A window of L costs the head L - 1 single-layer passes.
"""

from __future__ import annotations

import torch
from torch import nn

from vgen.models.cache import KVCache
from vgen.models.draft_head import DraftHead
from vgen.samplers.logits import draw, target_probs
from vgen.samplers.speculative.drafters import DraftContext, Drafter, Verification, register_drafter


class HeadDrafter(Drafter):
    name = "head"
    needs_hidden = True

    def __init__(self, head: DraftHead, target: nn.Module, context: DraftContext) -> None:
        super().__init__()
        head.check_target(target)
        self.head, self.target, self.params = head, target, context.params
        self.guided, self.static = context.params.guided, context.static
        self.cache: KVCache | None = None  # made at the first observe, for the run's batch
        self.features: torch.Tensor | None = None  # [R, dim]: the predicted feature for each row's next token

    def _double(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) if self.guided else x

    def observe(self, result: Verification) -> None:
        if self.cache is None:
            self.cache = self.head.new_cache(result.hidden.shape[0], extra=self.target.num_tokens)
        length = result.hidden.shape[1]
        index = result.pos[:, None] + torch.arange(length, device=result.pos.device)
        tokens = result.tokens.gather(1, index)  # token s pairs with the feature of slot s
        out = self.head.decode_rows(result.hidden, self._double(tokens), self._double(result.pos), self.cache,
                                    self.target, self.static)
        self.forward_passes += 1
        last = self._double(result.accepted)
        self.features = out[torch.arange(out.shape[0], device=out.device), last]

    def propose(self, tokens: torch.Tensor, pos: torch.Tensor, count: int,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        drafts, probs = [], []
        features = self.features
        for i in range(count):
            q = target_probs(self.target.output(features).float(), self.params, pos + i)
            draft = draw(q, self.params.greedy, generator)
            drafts.append(draft)
            probs.append(q)
            if i + 1 < count:
                features = self.head.decode_rows(features[:, None], self._double(draft)[:, None],
                                                 self._double(pos + i), self.cache, self.target, self.static)[:, 0]
                self.forward_passes += 1
        if not drafts:
            empty = torch.zeros(tokens.shape[0], 0, dtype=torch.long, device=tokens.device)
            return empty, torch.zeros(tokens.shape[0], 0, self.target.vocab_size, device=tokens.device)
        return torch.stack(drafts, dim=1), torch.stack(probs, dim=1)


def _build(options, model: nn.Module, context: DraftContext) -> HeadDrafter:
    if context.draft_head is None:
        raise ValueError("drafter 'head' needs a draft head, and this model ships none; train one with "
                         "`vgen train drafter`, or use drafter 'jacobi' (or 'auto')")
    return HeadDrafter(context.draft_head, model, context)


register_drafter("head", _build)
