"""Loading pipelines: a saved folder loads back equal (with its drafter), embedded defaults load by name, and a
name or folder that is not a pipeline fails with a specific error."""

from __future__ import annotations

import pytest
import torch

import vgen
from vgen.hub import CheckpointError
from vgen.models.draft_head import DraftHead, DraftHeadConfig
from vgen.pipelines import ImagePipeline, available_models, pipeline_folder


def test_save_and_load_round_trip(tiny_pipeline_dir, tmp_path):
    pipe = vgen.load(tiny_pipeline_dir)
    pipe.save_pretrained(tmp_path / "p")
    loaded = vgen.load(tmp_path / "p")
    assert loaded.info == pipe.info
    assert torch.equal(loaded(class_ids=[2], seed=4).tokens, pipe(class_ids=[2], seed=4).tokens)


def test_a_draft_head_travels_with_the_pipeline(tiny_pipeline_dir, tmp_path):
    pipe = vgen.load(tiny_pipeline_dir)
    pipe.draft_head = DraftHead(DraftHeadConfig.for_target(pipe.model.config)).eval()
    pipe.save_pretrained(tmp_path / "p")
    loaded = vgen.load(tmp_path / "p")
    assert isinstance(loaded.draft_head, DraftHead)
    out = loaded(class_ids=[1], seed=0, sampler="sjd", drafter="auto", window=4)
    assert out.stats.details["drafter"] == "head"
    assert torch.equal(out.tokens, loaded(class_ids=[1], seed=0, sampler="sjd", drafter="head", window=4).tokens)


def test_embedded_defaults_resolve_by_name_and_folders_by_path(tiny_pipeline_dir):
    assert "shapes-c2i" in available_models()
    assert pipeline_folder("shapes-c2i").name == "shapes-c2i"
    assert pipeline_folder(tiny_pipeline_dir) == tiny_pipeline_dir
    assert isinstance(vgen.load("shapes-c2i"), ImagePipeline)


def test_names_and_folders_that_are_not_pipelines_fail_specifically(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        vgen.load("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a vgen pipeline folder"):
        vgen.load(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pipeline.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="bad .*pipeline.json"):
        vgen.load(tmp_path / "bad")
