"""Many samples: which seed and label (class or prompt) each index gets, that a run is exactly the pipeline's
batches, that interrupted, damaged or extended runs resume to the same packed file, and that a failed write or a
damaged record leaves the folder usable; a text-to-image model's prompts go in turn and are packed beside the
images, a prompt set's ids and categories too, and its file and subset are in the manifest (every model kind:
test_sample_many_models.py; the multi-process runs: tests/apps/test_sample_many_cli.py)."""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vgen.data.prompts import PromptSet
from vgen.eval.sample_many import (
    MANIFEST,
    SamplePlan,
    pack_npz,
    sample_many,
    weights_fingerprint,
)
from vgen.pipelines import load
from vgen.samplers import SamplingParams, get_sampler


@pytest.fixture(scope="module")
def pipe(tiny_pipeline_dir):
    return load(tiny_pipeline_dir)


def run(pipe, out, n, plan, sampler="ar", **params):
    params = SamplingParams(**{**pipe.info.defaults, **params})
    return sample_many(pipe, out, n, plan, get_sampler(sampler), params, progress=False)


def packed(path):
    with np.load(path) as f:
        return f["arr_0"], f["arr_1"]


def test_labels_are_a_pure_function_of_the_index_and_seed():
    plan = SamplePlan(3, 4, (0, 1, 2))
    labels = plan.labels(range(40))
    assert labels == [plan.labels([i])[0] for i in range(40)]
    assert labels == SamplePlan(3, 7, (0, 1, 2)).labels(range(40))  # the batch size does not enter
    assert labels != SamplePlan(4, 4, (0, 1, 2)).labels(range(40))


def test_balanced_labels_count_every_class_equally_in_every_prefix():
    plan = SamplePlan(0, 4, (2, 5, 7), balanced=True)
    for n in range(1, 31):
        counts = Counter(plan.labels(range(n)))
        assert set(counts) <= {2, 5, 7}
        assert max(counts.values()) - min(counts[c] for c in (2, 5, 7)) <= 1
    assert Counter(plan.labels(range(30))) == {2: 10, 5: 10, 7: 10}


def test_uniform_labels_are_uniform_over_the_given_classes_only():
    counts = Counter(SamplePlan(1, 4, (1, 4, 6)).labels(range(6000)))
    assert set(counts) == {1, 4, 6}
    sigma = (6000 * (1 / 3) * (2 / 3)) ** 0.5
    assert all(abs(c - 2000) < 5 * sigma for c in counts.values())


def test_batch_seeds_are_distinct_32_bit_seeds_across_global_seeds_and_batches():
    seeds = [SamplePlan(s, 8, (0,)).batch_seed(k) for s in range(4) for k in range(1000)]
    assert len(set(seeds)) == len(seeds) and max(seeds) < 2**32
    # what matters: torch's CPU generator, which keeps only the low 32 bits, gives different noise
    low = {torch.randn(4, generator=torch.Generator().manual_seed(s)).sum().item() for s in seeds[::250]}
    assert len(low) == len(seeds[::250])
    assert SamplePlan(2, 8, (0,)).batch_seed(5) == SamplePlan(2, 8, (0,)).batch_seed(5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seed=-1, batch_size=4, class_ids=(0,)), "seed must be in"),
    (dict(seed=2**31, batch_size=4, class_ids=(0,)), "seed must be in"),
    (dict(seed=0, batch_size=0, class_ids=(0,)), "batch size must be >= 1"),
    (dict(seed=0, batch_size=4, class_ids=()), "no class ids"),
])
def test_bad_plans_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplePlan(**kwargs)


def test_a_run_is_the_pipelines_batches_with_their_seeds_and_labels(pipe, tmp_path):
    plan = SamplePlan(5, 3, (0, 1, 2))
    result = run(pipe, tmp_path / "run", 7, plan)
    assert result.npz == tmp_path / "run.npz" and (result.generated, result.reused) == (7, 0)
    images, labels = packed(result.npz)
    assert images.shape == (7, 16, 16, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and labels.tolist() == plan.labels(range(7))
    assert [len(plan.batch_indices(k, 7)) for k in range(3)] == [3, 3, 1]  # the last batch is cut short
    for k in range(3):
        idx = plan.batch_indices(k, 7)
        expected = pipe(plan.labels(idx), seed=plan.batch_seed(k)).images
        for i, image in zip(idx, expected):
            assert np.array_equal(images[i], np.asarray(image))
    assert sorted(p.name for p in (tmp_path / "run").glob("*.png")) == [f"{i:06d}.png" for i in range(7)]
    assert len({im.tobytes() for im in images}) == 7


def test_a_batch_larger_than_the_pipelines_chunks_is_drawn_as_one_batch(pipe, tmp_path, monkeypatch):
    """The pipeline draws a call of more images than its ``batch_size`` in chunks with other noise; a run's batch
    is one batch whatever that default is."""
    plan = SamplePlan(5, 3, (0, 1, 2))
    monkeypatch.setattr(pipe, "batch_size", 2)
    images, _ = packed(run(pipe, tmp_path / "run", 3, plan).npz)
    whole = pipe(plan.labels(range(3)), seed=plan.batch_seed(0), batch_size=3).images
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(images, whole))
    chunked = pipe(plan.labels(range(3)), seed=plan.batch_seed(0)).images
    assert not all(np.array_equal(a, np.asarray(b)) for a, b in zip(images, chunked))


class Interrupting:
    """The pipeline, interrupted (Ctrl-C) on its ``after + 1``-th call."""

    def __init__(self, pipe, after):
        self.pipe, self.after, self.calls = pipe, after, 0

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.after:
            raise KeyboardInterrupt
        return self.pipe(*args, **kwargs)


def test_an_interrupted_or_damaged_run_resumes_to_the_same_npz(pipe, tmp_path):
    plan = SamplePlan(0, 2, (0, 1, 2))
    reference = packed(run(pipe, tmp_path / "ref", 9, plan, sampler="sjd").npz)
    with pytest.raises(KeyboardInterrupt):
        sample_many(Interrupting(pipe, 2), tmp_path / "run", 9, plan, get_sampler("sjd"),
                    SamplingParams(**pipe.info.defaults), progress=False)
    assert sorted(p.name for p in (tmp_path / "run").glob("*.png")) == [f"{i:06d}.png" for i in range(4)]
    assert not (tmp_path / "run.npz").exists()
    (tmp_path / "run" / "000004.png.part").write_bytes(b"\x89PNG")  # what a SIGKILL inside a write leaves
    result = run(pipe, tmp_path / "run", 9, plan, sampler="sjd")
    assert (result.generated, result.reused) == (5, 4) and not list((tmp_path / "run").glob("*.part"))
    for a, b in zip(packed(result.npz), reference):
        assert np.array_equal(a, b)
    (tmp_path / "run" / "000005.png").unlink()
    result = run(pipe, tmp_path / "run", 9, plan, sampler="sjd")
    assert (result.generated, result.reused) == (2, 7)
    for a, b in zip(packed(result.npz), reference):
        assert np.array_equal(a, b)


def test_a_larger_count_extends_a_finished_run_to_what_a_fresh_run_of_that_size_packs(pipe, tmp_path):
    plan = SamplePlan(0, 4, (0, 1, 2), balanced=True)
    small = packed(run(pipe, tmp_path / "run", 6, plan).npz)
    result = run(pipe, tmp_path / "run", 11, plan)
    assert (result.generated, result.reused) == (7, 4)  # the short batch 4..5 is drawn again as 4..7
    big = packed(result.npz)
    assert np.array_equal(big[0][:4], small[0][:4]) and np.array_equal(big[1][:6], small[1])
    fresh = packed(run(pipe, tmp_path / "fresh", 11, plan).npz)
    assert np.array_equal(big[0], fresh[0]) and np.array_equal(big[1], fresh[1])
    result = run(pipe, tmp_path / "run", 6, plan)  # and back: the short batch again, as the first run drew it
    assert (result.generated, result.reused) == (2, 4)
    assert all(np.array_equal(a, b) for a, b in zip(packed(result.npz), small))


def test_a_folder_made_with_other_settings_is_refused(pipe, tmp_path):
    plan = SamplePlan(0, 2, (0, 1, 2))
    run(pipe, tmp_path / "run", 2, plan)
    with pytest.raises(ValueError, match=r"other settings \(plan: .*\"seed\": 0.* -> .*\"seed\": 1"):
        run(pipe, tmp_path / "run", 2, SamplePlan(1, 2, (0, 1, 2)))
    with pytest.raises(ValueError, match=r"other settings \(sampling: .*\"cfg_scale\": 2.0.* -> .*3.0"):
        run(pipe, tmp_path / "run", 2, plan, cfg_scale=3.0)
    with pytest.raises(ValueError, match=r"other settings \(sampler: "):
        run(pipe, tmp_path / "run", 2, plan, sampler="sjd")
    (tmp_path / "foreign").mkdir()
    Image.new("RGB", (16, 16)).save(tmp_path / "foreign" / "000000.png")
    with pytest.raises(ValueError, match=f"holds 000000.png, which these settings did not draw, and no {MANIFEST}"):
        run(pipe, tmp_path / "foreign", 2, plan)


@pytest.mark.parametrize("damage", ["", "{", "[1]", '{"settings": 3}'])
def test_a_damaged_manifest_is_rebuilt_when_every_png_records_this_run(pipe, tmp_path, damage):
    plan = SamplePlan(0, 2, (0, 1, 2))
    reference = packed(run(pipe, tmp_path / "run", 4, plan).npz)
    (tmp_path / "run" / MANIFEST).write_text(damage)  # as a kill while an older vgen rewrote it in place left it
    result = run(pipe, tmp_path / "run", 4, plan)
    assert (result.generated, result.reused) == (0, 4)
    assert all(np.array_equal(a, b) for a, b in zip(packed(result.npz), reference))
    assert json.loads((tmp_path / "run" / MANIFEST).read_text())["settings"]["plan"]["seed"] == 0
    (tmp_path / "run" / MANIFEST).write_text(damage)
    with pytest.raises(ValueError, match=rf"{MANIFEST} is damaged \(.*\), and .*000000.png was drawn with other "
                                         rf"settings: rerun the command that made .*run to repair it, or use a new"):
        run(pipe, tmp_path / "run", 4, SamplePlan(1, 2, (0, 1, 2)))
    (tmp_path / "run" / MANIFEST).unlink()  # a lost record: the PNGs still say which run drew them
    assert run(pipe, tmp_path / "run", 4, plan).reused == 4


def test_the_manifest_is_replaced_atomically(pipe, tmp_path, monkeypatch):
    plan = SamplePlan(0, 2, (0, 1, 2))
    run(pipe, tmp_path / "run", 2, plan)
    before = (tmp_path / "run" / MANIFEST).read_text()
    synced, replaced = [], []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    real_replace = os.replace

    def replace(src, dst):
        replaced.append((Path(src).name, Path(dst).name, bool(synced)))
        if Path(dst).name == MANIFEST:
            raise KeyboardInterrupt  # killed between writing the new record and renaming it
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        run(pipe, tmp_path / "run", 4, plan)
    assert replaced == [(MANIFEST + ".part", MANIFEST, True)]  # written in full and flushed, then renamed
    assert (tmp_path / "run" / MANIFEST).read_text() == before and not list((tmp_path / "run").glob("*.part"))


@pytest.mark.parametrize("keep", [0, 0.1, 0.5])
def test_a_damaged_png_is_named_and_drawn_again(pipe, tmp_path, keep):
    plan = SamplePlan(0, 2, (0, 1, 2))
    reference = packed(run(pipe, tmp_path / "run", 5, plan).npz)
    damaged = tmp_path / "run" / "000003.png"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:int(keep * len(data))])  # truncated, as a lost write leaves it
    with pytest.raises(ValueError, match=r"cannot read .*000003.png .*run the same command again"):
        pack_npz(tmp_path / "run", tmp_path / "run.npz", 5, plan)
    result = run(pipe, tmp_path / "run", 5, plan)
    assert (result.generated, result.reused) == (2, 3) and len(result.damaged) == 1
    assert str(damaged) in result.damaged[0] and "damaged" in result.damaged[0]
    assert all(np.array_equal(a, b) for a, b in zip(packed(result.npz), reference))


@pytest.mark.parametrize("failing", ["000002.png", "run.npz"])
def test_a_full_disk_leaves_no_part_files_and_names_the_file(pipe, tmp_path, monkeypatch, failing):
    plan = SamplePlan(0, 2, (0, 1, 2))
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if Path(file).name == failing + ".part":
            f.write(b"\x89PNG partial")

            def no_space(*_):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            f.write = no_space
        return f

    monkeypatch.setattr("builtins.open", full_disk_open)
    with pytest.raises(OSError, match=rf"cannot write .*{failing}: No space left on device") as caught:
        run(pipe, tmp_path / "run", 4, plan)
    assert caught.value.errno == errno.ENOSPC
    assert not list(tmp_path.rglob("*.part")) and not (tmp_path / "run.npz").exists()
    monkeypatch.undo()
    result = run(pipe, tmp_path / "run", 4, plan)  # space freed: the rerun finishes the run
    assert result.generated == (2 if failing.endswith(".png") else 0) and packed(result.npz)[0].shape[0] == 4


def test_packing_names_missing_samples(pipe, tmp_path):
    plan = SamplePlan(0, 2, (0, 1, 2))
    run(pipe, tmp_path / "run", 4, plan)
    (tmp_path / "run" / "000002.png").unlink()
    with pytest.raises(ValueError, match="1 of the first 4 samples are missing .* 000002.png"):
        pack_npz(tmp_path / "run", tmp_path / "x.npz", 4, plan)


def test_the_manifest_fingerprints_the_weights(tiny_pipeline_dir):
    a, b = load(tiny_pipeline_dir), load(tiny_pipeline_dir)
    assert weights_fingerprint(a) == weights_fingerprint(b)
    with torch.no_grad():
        b.tokenizer.post_quant_conv.weight[0, 0, 0, 0] += 1e-3
    assert weights_fingerprint(a) != weights_fingerprint(b)


def test_out_of_range_classes_and_counts_are_refused(pipe, tmp_path):
    with pytest.raises(ValueError, match="class id 5 is out of range"):
        run(pipe, tmp_path / "run", 2, SamplePlan(0, 2, (0, 5)))
    with pytest.raises(ValueError, match=r"num_samples must be an integer in \[1, 10000000\], got 0"):
        run(pipe, tmp_path / "run", 0, SamplePlan(0, 2, (0,)))
    with pytest.raises(ValueError, match=r"num_samples must be an integer in \[1, 10000000\], got 1000"):
        run(pipe, tmp_path / "run", 10**30, SamplePlan(0, 2, (0,)))
    assert not (tmp_path / "run").exists()  # refused before anything was written


# ---- prompts: a text-to-image model's caption set ----------------------------------------------------------------

PROMPTS = ("a large blue ring on a yellow background", "a small red star at the top left", "a green heart")


@pytest.fixture(scope="module")
def t2i(tiny_t2i_pipeline_dir):
    return load(tiny_t2i_pipeline_dir)


def packed_prompts(path):
    with np.load(path) as f:
        return f["prompts"].tolist()


def test_prompts_go_in_turn_and_the_npz_stores_each_samples_prompt(t2i, tmp_path):
    plan = SamplePlan(2, 3, prompts=PROMPTS)
    result = run(t2i, tmp_path / "run", 7, plan)
    images, labels = packed(result.npz)
    assert images.shape == (7, 16, 16, 3) and labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert packed_prompts(result.npz) == [PROMPTS[i % 3] for i in range(7)]
    for k in range(3):
        idx = plan.batch_indices(k, 7)
        expected = t2i(prompt=[PROMPTS[i % 3] for i in idx], seed=plan.batch_seed(k)).images
        for i, image in zip(idx, expected):
            assert np.array_equal(images[i], np.asarray(image))


def test_a_prompt_run_resumes_exactly_and_refuses_other_prompts(t2i, tmp_path):
    plan = SamplePlan(0, 2, prompts=PROMPTS)
    reference = packed(run(t2i, tmp_path / "run", 5, plan).npz)
    (tmp_path / "run" / "000002.png").unlink()
    result = run(t2i, tmp_path / "run", 5, plan)
    assert (result.generated, result.reused) == (2, 3)
    assert all(np.array_equal(a, b) for a, b in zip(packed(result.npz), reference))
    recorded = json.loads((tmp_path / "run" / MANIFEST).read_text())["settings"]["plan"]["prompts"]
    assert recorded["count"] == 3 and len(recorded["sha256"]) == 64 and "class_ids" not in recorded
    for other in (PROMPTS[:2], (*PROMPTS[:2], "a green square"), PROMPTS[::-1]):
        with pytest.raises(ValueError, match=r"other settings \(plan: .*\"prompts\": \{\"count\": 3, \"sha256\""):
            run(t2i, tmp_path / "run", 5, SamplePlan(0, 2, prompts=other))


def test_a_class_runs_settings_record_its_plan_as_they_always_have():
    """A class run's record keeps its keys, so that folders drawn before prompts existed still resume."""
    assert SamplePlan(3, 2, (0, 2), balanced=True).to_dict() == {"seed": 3, "batch_size": 2, "class_ids": [0, 2],
                                                                 "balanced": True}


def test_prompts_for_a_class_model_and_class_ids_for_a_text_model_are_refused(pipe, t2i, tmp_path):
    with pytest.raises(ValueError, match="tiny is class-conditional: give it class ids, not prompts"):
        run(pipe, tmp_path / "a", 2, SamplePlan(0, 2, prompts=PROMPTS))
    with pytest.raises(ValueError, match="tiny-t2i is a text-to-image model: give it prompts"):
        run(t2i, tmp_path / "b", 2, SamplePlan(0, 2, (0, 1)))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


PARTI = PromptSet(PROMPTS, ("4", "9", "17"), ("Abstract", "Animals", "Animals"), ("Basic", "Colors", "Basic"),
                  "parti", "PartiPrompts.tsv", subset_size=3, subset_seed=5)


def test_a_prompt_sets_ids_and_columns_are_packed_per_sample_and_its_file_is_in_the_manifest(t2i, tmp_path):
    plan = SamplePlan(2, 3, prompt_set=PARTI)
    assert plan.prompts == PROMPTS and replace(plan, seed=3).prompt_set == PARTI
    result = run(t2i, tmp_path / "run", 5, plan)
    with np.load(result.npz) as f:
        assert f["arr_1"].tolist() == [0, 1, 2, 0, 1] and f["prompts"].tolist() == [PROMPTS[i % 3] for i in range(5)]
        assert f["ids"].tolist() == ["4", "9", "17", "4", "9"]
        assert f["categories"].tolist() == ["Abstract", "Animals", "Animals", "Abstract", "Animals"]
        assert f["challenges"].tolist() == ["Basic", "Colors", "Basic", "Basic", "Colors"]
    plain = run(t2i, tmp_path / "plain", 5, SamplePlan(2, 3, prompts=PROMPTS))
    assert np.array_equal(packed(plain.npz)[0], packed(result.npz)[0])  # the images depend on the prompts only
    with np.load(plain.npz) as f:
        assert sorted(f.files) == ["arr_0", "arr_1", "prompts"]
    manifest = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert manifest["prompt_set"] == {
        "source": "PartiPrompts.tsv", "format": "parti", "subset": 3, "subset_seed": 5,
        "prompts": [{"prompt": p, "id": i, "category": c, "challenge": h}
                    for p, i, c, h in zip(PROMPTS, PARTI.ids, PARTI.categories, PARTI.challenges)]}
    assert "prompt_set" not in json.loads((tmp_path / "plain" / MANIFEST).read_text())


def test_a_prompt_sets_format_and_subset_are_settings_but_its_file_is_not(t2i, tmp_path):
    run(t2i, tmp_path / "run", 2, SamplePlan(0, 2, prompt_set=PARTI))
    moved = replace(PARTI, source="elsewhere/PartiPrompts.tsv")
    assert run(t2i, tmp_path / "run", 2, SamplePlan(0, 2, prompt_set=moved)).reused == 2
    for other in (replace(PARTI, subset_seed=6), replace(PARTI, subset_size=None), replace(PARTI, format="text")):
        with pytest.raises(ValueError, match=r"other settings \(plan: "):
            run(t2i, tmp_path / "run", 2, SamplePlan(0, 2, prompt_set=other))


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=PROMPTS[:2], prompt_set=PARTI), "give prompts or a prompt set, not both"),
    (dict(class_ids=(0,), prompts=PROMPTS), "give class ids or prompts, not both"),
    (dict(prompts=PROMPTS, balanced=True), "balanced is for class ids: prompts always go in turn"),
    (dict(prompts=("a red star", " ")), "every prompt must be a non-empty string"),
    (dict(), "no class ids"),
])
def test_bad_prompt_plans_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplePlan(0, 2, **kwargs)


def test_the_fingerprint_covers_the_text_encoder(tiny_t2i_pipeline_dir):
    a, b = load(tiny_t2i_pipeline_dir), load(tiny_t2i_pipeline_dir)
    assert weights_fingerprint(a) == weights_fingerprint(b)
    with torch.no_grad():
        b.text_encoder.embed.weight[0, 0] += 1e-3
    assert weights_fingerprint(a) != weights_fingerprint(b)
