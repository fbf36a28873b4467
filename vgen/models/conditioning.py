"""What vgen's class-conditional backbones expose alike: the class count and the null condition that
classifier-free guidance pairs with each class id, and for discrete-token models their grid and vocabulary.

Each backbone keeps its settings in ``self.config``; these mixins read them from there, so a sampler or a
pipeline can ask any backbone the same questions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ClassConditional:
    """A model conditioned on ``config.num_classes`` classes through a table with one extra (null) row."""

    config: Any

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    def null_condition(self, class_ids: torch.Tensor) -> torch.Tensor:
        """The unconditional counterpart of ``class_ids`` (the null class row), for CFG."""
        return torch.full_like(class_ids, self.config.num_classes)


class TokenGridModel(ClassConditional):
    """A class-conditional model over ``config.num_tokens`` discrete tokens of ``config.vocab_size`` codes laid
    out on ``config.grid`` ((rows, columns) or (frames, rows, columns))."""

    @property
    def grid(self) -> tuple[int, ...]:
        return self.config.grid

    @property
    def num_tokens(self) -> int:
        return self.config.num_tokens

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size


def init_llamagen_weights(module: nn.Module) -> None:
    """LlamaGen's initialisation, applied module by module: N(0, 0.02) for linear weights and embeddings."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
