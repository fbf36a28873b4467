"""A bounded key/value cache for streaming block generation: sink blocks, a rolling local window, and an optional
bank of evicted blocks from which the most similar ones are retrieved (BlockVid's semantic sparse context).

Layout. Every layer owns one preallocated buffer of ``sink_blocks + window_blocks`` blocks and, with a bank, one
of ``bank_blocks`` blocks; nothing grows with the length of the stream. The first ``sink_blocks`` blocks ever
pushed stay for good (attention sinks, as in StreamingLLM and Self-Forcing). Later blocks fill the window; when
it is full, pushing a block evicts the oldest window block, shifting the rest left (Self-Forcing's rolling
cache), and moves it to the bank, whose oldest entry is dropped when the bank is full.

Retrieval. Each block has a summary: the mean over its tokens of its last-layer keys. :meth:`context` ranks the
bank by cosine similarity to the summary of the newest cached block and puts the top ``retrieved_blocks`` (in time
order) between the sinks and the window; each batch row ranks on its own.

Keys are stored unrotated: the caller rotates them by their place in the attended sequence, so positions stay in
the trained range however long the stream runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class CachePolicy:
    """How many blocks the cache keeps: sinks, the local window, retrieved blocks and the bank they come from."""

    sink_blocks: int = 1
    window_blocks: int = 6
    retrieved_blocks: int = 0
    bank_blocks: int = 0

    def __post_init__(self) -> None:
        if self.sink_blocks < 0 or self.retrieved_blocks < 0 or self.bank_blocks < 0:
            raise ValueError(f"sink, retrieved and bank block counts must be >= 0, got {self}")
        if self.window_blocks < 1:
            raise ValueError(f"the local window must hold at least one block, got {self.window_blocks}")
        if self.retrieved_blocks > self.bank_blocks:
            raise ValueError(f"cannot retrieve {self.retrieved_blocks} blocks from a bank of {self.bank_blocks}")

    @property
    def context_blocks(self) -> int:
        """The most blocks a context can hold."""
        return self.sink_blocks + self.retrieved_blocks + self.window_blocks


class RollingKVCache:
    """Per-layer keys/values [B, H, blocks * block_tokens, D] of whole blocks, bounded by a :class:`CachePolicy`.

    ``block_ids`` (absolute block indices, sinks then window) and ``bank_ids`` say which blocks are resident.
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, block_tokens: int,
                 policy: CachePolicy, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.policy, self.block_tokens = policy, block_tokens
        resident = (policy.sink_blocks + policy.window_blocks) * block_tokens

        def buffers(tokens: int) -> list[torch.Tensor]:
            return [torch.zeros(batch_size, num_heads, tokens, head_dim, dtype=dtype, device=device)
                    for _ in range(2 * num_layers)]

        self.kv = buffers(resident)  # keys of layer i at 2i, values at 2i + 1
        self.bank = buffers(policy.bank_blocks * block_tokens)
        width = num_heads * head_dim
        self.summaries = torch.zeros(batch_size, policy.sink_blocks + policy.window_blocks, width, device=device)
        self.bank_summaries = torch.zeros(batch_size, policy.bank_blocks, width, device=device)
        self.block_ids: list[int] = []
        self.bank_ids: list[int] = []
        self.pushed = 0

    @property
    def num_layers(self) -> int:
        return len(self.kv) // 2

    def _span(self, slot: int, count: int = 1) -> slice:
        return slice(slot * self.block_tokens, (slot + count) * self.block_tokens)

    @staticmethod
    def _summary(keys: torch.Tensor) -> torch.Tensor:
        """[B, H, t, D] -> [B, H*D]: the mean key of a block."""
        return keys.float().mean(dim=2).flatten(1)

    def push(self, kvs: list[KV]) -> int | None:
        """Store one block's keys/values (one [B, H, block_tokens, D] pair per layer) as the newest block.

        Returns the absolute index of the block it evicted from the window, or None."""
        if len(kvs) != self.num_layers or kvs[0][0].shape[2] != self.block_tokens:
            raise ValueError(f"push takes {self.num_layers} (keys, values) pairs of {self.block_tokens} tokens")
        p = self.policy
        evicted = None
        slot = len(self.block_ids)
        if slot == p.sink_blocks + p.window_blocks:
            evicted = self.block_ids.pop(p.sink_blocks)
            if p.bank_blocks:
                self._to_bank(evicted, p.sink_blocks)
            keep = self._span(p.sink_blocks + 1, p.window_blocks - 1)
            dest = self._span(p.sink_blocks, p.window_blocks - 1)
            for buf in self.kv:
                buf[:, :, dest] = buf[:, :, keep].clone()
            self.summaries[:, p.sink_blocks:-1] = self.summaries[:, p.sink_blocks + 1:].clone()
            slot -= 1
        span = self._span(slot)
        for i, (k, v) in enumerate(kvs):
            self.kv[2 * i][:, :, span] = k
            self.kv[2 * i + 1][:, :, span] = v
        self.summaries[:, slot] = self._summary(kvs[-1][0])
        self.block_ids.append(self.pushed)
        self.pushed += 1
        return evicted

    def _to_bank(self, block_id: int, slot: int) -> None:
        """Copy the resident block at ``slot`` into the bank (dropping the bank's oldest block when full)."""
        n = len(self.bank_ids)
        if n == self.policy.bank_blocks:
            for buf in self.bank:
                buf[:, :, self._span(0, n - 1)] = buf[:, :, self._span(1, n - 1)].clone()
            self.bank_summaries[:, :-1] = self.bank_summaries[:, 1:].clone()
            self.bank_ids.pop(0)
            n -= 1
        for buf, src in zip(self.bank, self.kv):
            buf[:, :, self._span(n)] = src[:, :, self._span(slot)]
        self.bank_summaries[:, n] = self.summaries[:, slot]
        self.bank_ids.append(block_id)

    def retrieve(self) -> torch.Tensor | None:
        """Bank slots [B, l] of the ``retrieved_blocks`` bank blocks most similar to the newest block, in time
        order (None when nothing is retrieved)."""
        l_max = min(self.policy.retrieved_blocks, len(self.bank_ids))
        if l_max == 0 or not self.block_ids:
            return None
        query = self.summaries[:, len(self.block_ids) - 1]
        sims = F.cosine_similarity(self.bank_summaries[:, :len(self.bank_ids)], query[:, None], dim=-1)
        return sims.topk(l_max, dim=1).indices.sort(dim=1).values

    def context(self) -> tuple[list[KV] | None, int, torch.Tensor | None]:
        """Keys/values to attend to, one pair per layer ([B, H, blocks * block_tokens, D]: sinks, retrieved
        blocks, window), how many blocks that is, and the bank slots retrieved (None without retrieval)."""
        if not self.block_ids:
            return None, 0, None
        p, n = self.policy, len(self.block_ids)
        picked = self.retrieve()
        sinks = min(n, p.sink_blocks)
        out = []
        for layer in range(self.num_layers):
            pair = []
            for j in (0, 1):
                resident = self.kv[2 * layer + j]
                parts = [resident[:, :, self._span(0, sinks)]]
                if picked is not None:
                    parts.append(self._gather(self.bank[2 * layer + j], picked))
                parts.append(resident[:, :, self._span(sinks, n - sinks)])
                pair.append(torch.cat(parts, dim=2))
            out.append((pair[0], pair[1]))
        return out, n + (0 if picked is None else picked.shape[1]), picked

    def _gather(self, buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Blocks at per-row bank ``slots`` [B, l] of ``buf`` [B, H, bank_tokens, D] -> [B, H, l * block_tokens, D]."""
        t = self.block_tokens
        tokens = (slots[:, :, None] * t + torch.arange(t, device=slots.device)).flatten(1)  # [B, l*t]
        index = tokens[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3])
        return buf.gather(2, index)

    def replace(self, kvs: list[KV], first_block: int = 0) -> None:
        """Overwrite the keys/values and summaries of the resident blocks from slot ``first_block`` on (one
        [B, H, tokens, D] pair per layer over exactly those blocks, in resident order), e.g. after re-encoding them;
        ``first_block = sink_blocks`` keeps the sinks' keys/values. The bank is left as it is."""
        n = len(self.block_ids)
        if not 0 <= first_block <= n:
            raise ValueError(f"first_block {first_block} is outside the {n} resident blocks")
        span = self._span(first_block, n - first_block)
        if len(kvs) != self.num_layers or kvs[0][0].shape[2] != span.stop - span.start:
            raise ValueError(f"replace takes {self.num_layers} (keys, values) pairs over the {n - first_block} "
                             f"resident blocks from slot {first_block}")
        for i, (k, v) in enumerate(kvs):
            self.kv[2 * i][:, :, span] = k
            self.kv[2 * i + 1][:, :, span] = v
        last = kvs[-1][0]
        for slot in range(first_block, n):
            self.summaries[:, slot] = self._summary(last[:, :, self._span(slot - first_block)])

    def clear(self) -> None:
        """Forget every block, resident and banked (the buffers stay allocated): the next block pushed is a sink
        again, at frame position 0, as at a stream's start. ``pushed`` keeps counting, so block ids stay unique."""
        self.block_ids.clear()
        self.bank_ids.clear()

    def nbytes(self) -> int:
        """Bytes held by every buffer (constant over the cache's life)."""
        return sum(b.numel() * b.element_size() for b in (*self.kv, *self.bank, self.summaries, self.bank_summaries))
