"""Many samples from every kind of model: next-token AR, NAR and continuous-token images, NBP, NAR and AR video
clips, and a streaming (block-diffusion) model's clips of a chosen length. The packed file holds exactly the
pipeline's own samples, batch by batch with a short last batch (images [N, H, W, 3], clips [N, T, H, W, 3]), one PNG
per sample (a clip's frames top to bottom), and a rerun keeps them."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from PIL import Image

from vgen.eval.sample_many import SamplePlan, StreamClips, sample_many
from vgen.pipelines import ImagePipeline, PipelineInfo, VideoPipeline, default_sampler, load
from vgen.samplers import SamplingParams, get_sampler
from vgen.tokenizers.vq import VQConfig, VQModel

KINDS = ["c2i", "continuous", "nar", "video-nar", "video-nbp", "video-ar"]
SAVED = {"c2i": "tiny_pipeline_dir", "continuous": "tiny_continuous_pipeline_dir",
         "video-nbp": "tiny_video_pipeline_dir", "video-ar": "tiny_video_ar_pipeline_dir"}


def tiny_vq() -> VQModel:
    return VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8,
                            norm_groups=4))


@pytest.fixture(params=KINDS)
def pipe(request, tiny_nar_factory):
    """A tiny 3-class pipeline of each kind, 16-px images or 3 frames of 16 px."""
    if request.param in SAVED:
        return load(request.getfixturevalue(SAVED[request.param]))
    info = PipelineInfo(name=f"tiny-{request.param}", image_size=16, defaults={"cfg_scale": 2.0})
    if request.param == "nar":
        return ImagePipeline(tiny_nar_factory((4, 4), vocab_size=32, num_classes=3), tiny_vq(), info)
    return VideoPipeline(tiny_nar_factory((3, 4, 4), vocab_size=32, num_classes=3), tiny_vq(), info)


def samples(out) -> np.ndarray:
    return np.asarray(out.videos) if hasattr(out, "videos") else np.stack([np.asarray(im) for im in out.images])


def test_every_kind_packs_the_pipelines_own_samples_and_resumes(pipe, tmp_path):
    plan = SamplePlan(1, 2, (0, 1, 2))
    sampler, params = get_sampler(default_sampler(pipe.model)), SamplingParams(**pipe.info.defaults)
    result = sample_many(pipe, tmp_path / "run", 3, plan, sampler, params, progress=False)
    assert (result.generated, result.reused) == (3, 0)
    with np.load(result.npz) as f:
        packed, labels = f["arr_0"], f["arr_1"]
    frames = getattr(pipe, "num_frames", None)
    assert packed.shape == (3, *((frames,) if frames else ()), 16, 16, 3) and packed.dtype == np.uint8
    assert labels.tolist() == plan.labels(range(3))
    expected = np.concatenate([samples(pipe(plan.labels(plan.batch_indices(k, 3)), sampler=sampler,
                                            seed=plan.batch_seed(k), **params.to_dict())) for k in range(2)])
    assert np.array_equal(packed, expected)
    assert sorted(p.name for p in (tmp_path / "run").glob("*.png")) == ["000000.png", "000001.png", "000002.png"]
    with Image.open(tmp_path / "run" / "000002.png") as png:
        assert np.array_equal(np.asarray(png.convert("RGB")), packed[2].reshape(-1, 16, 3))
    again = sample_many(pipe, tmp_path / "run", 3, plan, sampler, params, progress=False)
    assert (again.generated, again.reused) == (0, 3)
    with np.load(again.npz) as f:
        assert np.array_equal(f["arr_0"], packed)


@pytest.fixture(scope="module")
def stream_pipe(tiny_stream_pipeline_dir):
    return load(tiny_stream_pipeline_dir)


def test_a_streaming_model_packs_its_own_clips_of_the_chosen_length_and_resumes(stream_pipe, tmp_path):
    plan, clips = SamplePlan(1, 2, (0, 1, 2)), StreamClips(stream_pipe.stream_config(cfg_scale=2.0), 5)
    result = sample_many(stream_pipe, tmp_path / "run", 3, plan, None, clips, progress=False)
    with np.load(result.npz) as f:
        packed, labels = f["arr_0"], f["arr_1"]
    assert packed.shape == (3, 5, 16, 16, 3) and packed.dtype == np.uint8 and labels.tolist() == plan.labels(range(3))
    expected = np.concatenate([stream_pipe(plan.labels(plan.batch_indices(k, 3)), 5, seed=plan.batch_seed(k),
                                           **asdict(clips.config)).videos for k in range(2)])
    assert np.array_equal(packed, expected)
    (tmp_path / "run" / "000001.png").unlink()
    again = sample_many(stream_pipe, tmp_path / "run", 3, plan, None, clips, progress=False)
    assert (again.generated, again.reused) == (2, 1)
    with np.load(again.npz) as f:
        assert np.array_equal(f["arr_0"], packed)
    with pytest.raises(ValueError, match=r"other settings \(stream: .*\"cfg_scale\": 2.0.* -> .*\"cfg_scale\": 1.0"):
        sample_many(stream_pipe, tmp_path / "run", 3, plan, None, StreamClips(stream_pipe.stream_config(), 5),
                    progress=False)
    with pytest.raises(ValueError, match=r"other settings \(frames: 5 -> 4\)"):
        sample_many(stream_pipe, tmp_path / "run", 3, plan, None, StreamClips(clips.config, 4), progress=False)


def test_a_streaming_drawing_must_fit_the_pipeline_before_anything_is_written(stream_pipe, tiny_pipeline_dir,
                                                                             tmp_path):
    plan = SamplePlan(0, 2, (0,))
    with pytest.raises(ValueError, match="window_frames=3 is not a whole number of 2-frame blocks"):
        sample_many(stream_pipe, tmp_path / "run", 2, plan, None,
                    StreamClips(stream_pipe.stream_config(window_frames=3), 4), progress=False)
    with pytest.raises(TypeError, match="streams clips: give StreamClips and no sampler"):
        sample_many(stream_pipe, tmp_path / "run", 2, plan, get_sampler("ar"), SamplingParams(), progress=False)
    with pytest.raises(TypeError, match="samples tokens: give a sampler and SamplingParams"):
        sample_many(load(tiny_pipeline_dir), tmp_path / "run", 2, plan, None,
                    StreamClips(stream_pipe.stream_config(), 4), progress=False)
    with pytest.raises(ValueError, match=r"num_frames must be an integer in \[1, 10000000\], got 0"):
        StreamClips(stream_pipe.stream_config(), 0)
    assert not (tmp_path / "run").exists()
