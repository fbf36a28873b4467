"""Tree verify passes (``decode_rows(tree=)``, ``KVCache.move_slots``) on every backbone that supports them: each
node of a draft tree, scored in one pass, gets the logits of its root path decoded alone (eager and static); moving
an accepted path's keys into place leaves the cache as if that path had been decoded; a chain is an ordinary
window, bit for bit. The rows of the batch stand at different places, over stale keys."""

from __future__ import annotations

import copy

import pytest
import torch

from vgen.models.conditioning import PrefixCondition
from vgen.models.llamagen import GPTConfig
from vgen.samplers.speculative.tree import TreeShape

PARENTS = [-1, 0, 1, 2, 0, 4, 1, 6]  # the chain 0-1-2-3, a branch 4-5 off the root, a branch 6-7 off node 1
TREE = TreeShape.from_parents(PARENTS)
STARTS = torch.tensor([2, 4])  # each row's root is its image token starts - 1, at slot starts (after a class)
PATHS = [[0, 4, 5], [0, 1, 6, 7]]  # the paths each row accepts, both through a branch
ATOL = 1e-5
CONFIGS = {
    "c2i": GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=16),
    "t2i": GPTConfig(vocab_size=40, dim=64, n_layer=2, n_head=4, block_size=16, model_type="t2i", caption_dim=24,
                     cls_token_num=10),
    # three frames of 2 x 2 tokens: a branch node's slot lies in a later frame than its position
    "video-grid": GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=12, frames=3),
    "video-spatial": GPTConfig(vocab_size=48, dim=64, n_layer=2, n_head=4, num_classes=7, block_size=12, frames=3,
                               rope="spatial"),
}


def root_path(node: int) -> list[int]:
    """The nodes from the root down to ``node`` of :data:`PARENTS`."""
    return root_path(PARENTS[node]) + [node] if node >= 0 else []


@pytest.fixture(params=[*CONFIGS, "janus"])
def backbone(request, tiny_gpt_factory):
    """A model, its condition for two rows (t2i and Janus: prompts of different lengths, left-padded) and its
    vocabulary size."""
    if request.param == "janus":
        pytest.importorskip("transformers", reason="Janus needs transformers (pip install -e '.[t2i]')")
        from vgen.models.janus import load_janus

        janus = load_janus(request.getfixturevalue("tiny_janus_dir"))
        return janus.model, janus.condition(["a red cat", "a big blue dog on the moon"]), janus.model.vocab_size
    config = CONFIGS[request.param]
    model = tiny_gpt_factory(config)
    if not config.text_conditional:
        return model, torch.tensor([3, 7]), config.vocab_size
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(config.cls_token_num)[None, :] >= config.cls_token_num - torch.tensor([3, 7])[:, None]
    values = torch.randn(2, config.cls_token_num, config.caption_dim, generator=g) * mask[..., None]
    return model, PrefixCondition(values, mask), config.vocab_size


def committed(model, cond, vocab: int):
    """A cache holding each row's image tokens before its root (and stale ones after), and the tree's tokens."""
    g = torch.Generator().manual_seed(1)
    cache = model.new_cache(2, extra=len(PARENTS))
    model.prefill(cond, cache)
    model.decode_rows(torch.randint(vocab, (2, int(STARTS.max()) - 1), generator=g), torch.ones(2, dtype=torch.long),
                      cache)
    return cache, torch.randint(vocab, (2, len(PARENTS)), generator=g)


@torch.no_grad()
def test_every_node_gets_the_logits_of_its_root_path_decoded_alone(backbone) -> None:
    model, cond, vocab = backbone
    cache, nodes = committed(model, cond, vocab)
    fresh = copy.deepcopy(cache)
    got = model.decode_rows(nodes, STARTS, cache, tree=TREE)
    for node in range(len(PARENTS)):
        path = root_path(node)
        want = model.decode_rows(nodes[:, path], STARTS, copy.deepcopy(fresh))[:, -1]
        torch.testing.assert_close(got[:, node], want, atol=ATOL, rtol=0)
    for image_end in (None, int(STARTS.max()) + len(PARENTS)):
        static = model.decode_rows(nodes, STARTS, copy.deepcopy(fresh), static=True, image_end=image_end,
                                   tree=TREE)
        torch.testing.assert_close(static, got, atol=ATOL, rtol=0)


@torch.no_grad()
def test_moving_an_accepted_branch_into_place_equals_decoding_it(backbone) -> None:
    """Row 0 accepts 3 nodes, row 1 four; the next pass, from after each row's path, sees exactly that path."""
    model, cond, vocab = backbone
    cache, nodes = committed(model, cond, vocab)
    fresh = copy.deepcopy(cache)
    model.decode_rows(nodes, STARTS, cache, tree=TREE)
    width = max(map(len, PATHS))
    path = torch.tensor([p + [0] * (width - len(p)) for p in PATHS])
    accepted = torch.tensor([[i < len(p) for i in range(width)] for p in PATHS])
    root = model.tree_root_slots(STARTS, cache)[:, None]  # past a prompt, the cache's slots are shifted
    cache.move_slots(root + path, root + torch.arange(width), accepted)
    after = STARTS + accepted.sum(1)
    nxt = torch.randint(vocab, (2, 3), generator=torch.Generator().manual_seed(2))
    model.decode_rows(nodes.gather(1, path), STARTS, fresh)  # row 0's fourth token is stale, then overwritten
    torch.testing.assert_close(model.decode_rows(nxt, after, cache), model.decode_rows(nxt, after, fresh),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@torch.no_grad()
def test_a_chain_is_an_ordinary_window_bit_for_bit(backbone, static: bool) -> None:
    model, cond, vocab = backbone
    cache, nodes = committed(model, cond, vocab)
    got = model.decode_rows(nodes, STARTS, copy.deepcopy(cache), static=static, tree=TreeShape.chain(len(PARENTS)))
    assert torch.equal(got, model.decode_rows(nodes, STARTS, cache, static=static))
