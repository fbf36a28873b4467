"""benchmarks/draft_sources.py: drafts judged up to each pass's first rejection, counted by source (carried or
fresh), and the places where passes end."""

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "draft_sources.py"
spec = importlib.util.spec_from_file_location("draft_sources", SCRIPT)
draft_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(draft_sources)


def test_passes_are_tallied_by_draft_source_and_by_where_they_end() -> None:
    """A 4x4 image, windows of 4 drafts. Row a: at token 1, 2 carried, 3 kept, so the fresh draft at token 4 (a row
    start) was rejected. Row b: at token 6, 1 carried, none kept (the carried draft at token 6 rejected). Row c:
    at token 16, done (ignored)."""
    passes = [(torch.tensor([1, 6, 16]), torch.tensor([2, 1, 0]), torch.tensor([3, 0, 0]), 4)]
    judged, kept, ends = draft_sources.tally(passes, (4, 4), 16)
    assert dict(judged) == {"carried": 3, "fresh": 2} and dict(kept) == {"carried": 2, "fresh": 1}
    assert dict(ends) == {("row start", "fresh"): 1, ("inside row", "carried"): 1}


def test_a_frames_first_token_is_named_as_such() -> None:
    assert draft_sources.place(16, (2, 4, 4)) == "frame start" and draft_sources.place(16, (8, 4)) == "row start"
    assert draft_sources.place(5, (4, 4)) == "row 2nd" and draft_sources.place(7, (4, 4)) == "inside row"
