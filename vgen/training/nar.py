"""Teacher-forced NAR training: one full pass under the proximity mask over the whole, unshifted token grid.

Every cell's logits are the mean of the dimension-oriented heads that predict it from its available predecessors
(the first cell: every head at the class position), and the loss is the cross-entropy of those logits against all
N tokens, as NAR trains (``model(cond_idx, idx=z, targets=z, mask=proximity_mask)``). Each head thus learns its own
direction's targets through the average the sampler uses. LlamaGen's class dropout (in ``model.train()``) trains
the null class that guidance needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vgen.models.nar import NARConfig, NARTransformer
from vgen.training.ar import SHAPES_GPT

# shapes-nar: the shapes AR model's width, vocabulary and classes on its 16x16 grid, with one block fewer in the
# trunk so that trunk + the below head's extra block match its 8 blocks (a fair speed comparison)
SHAPES_NAR = NARConfig(grid=(SHAPES_GPT.grid_size,) * 2, vocab_size=SHAPES_GPT.vocab_size, dim=SHAPES_GPT.dim,
                       n_layer=SHAPES_GPT.n_layer - 1, n_head=SHAPES_GPT.n_head, multiple_of=SHAPES_GPT.multiple_of,
                       num_classes=SHAPES_GPT.num_classes, class_dropout_prob=SHAPES_GPT.class_dropout_prob,
                       token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


def nar_loss(model: NARTransformer, class_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over every cell of ``tokens`` [B, N] (raster order) and the top-1 accuracy, in the
    ``(loss, figures)`` form a :class:`~vgen.training.trainer.Trainer` step returns."""
    logits = model(class_ids, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    return loss, {"acc": float((logits.argmax(-1) == tokens).float().mean())}

