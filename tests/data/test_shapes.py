"""The shapes data set: seeded, class-balanced, anti-aliased, textured, and classes stay distinguishable."""

from __future__ import annotations

import numpy as np
import pytest

from vgen.data.shapes import (
    CLASS_NAMES,
    NUM_CLASSES,
    ShapesConfig,
    ShapesDataset,
    cached_split,
    data_config,
    image_rng,
    render,
    render_batch,
    sample_image,
    set_data_config,
    to_tensor,
)


def test_at_least_eight_classes_with_unique_names():
    assert NUM_CLASSES >= 8
    assert len(set(CLASS_NAMES)) == NUM_CLASSES


def test_same_seed_and_index_give_the_same_image_and_others_differ():
    a, la = sample_image(0, 5)
    b, lb = sample_image(0, 5)
    c, _ = sample_image(1, 5)
    d, _ = sample_image(0, 13)  # same class (13 % 8 == 5), another image
    assert la == lb == 5
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def test_images_are_64px_rgb_uint8_and_classes_cycle_evenly():
    images, labels = render_batch(seed=3, start=0, count=2 * NUM_CLASSES)
    assert images.shape == (2 * NUM_CLASSES, 64, 64, 3) and images.dtype == np.uint8
    assert np.bincount(labels, minlength=NUM_CLASSES).tolist() == [2] * NUM_CLASSES


def test_shapes_are_anti_aliased():
    """Supersampled edges leave intermediate values: many distinct colours, not a 2-level mask."""
    img = render(0, image_rng(0, 0))
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 500


def test_backgrounds_are_textured_not_flat_gradients():
    """The local pixel variation of the background (away from the shape) is far above a smooth gradient's."""
    images, _ = render_batch(seed=7, start=0, count=32)
    assert np.median(second_difference(images)) > 4.0


def second_difference(images: np.ndarray) -> np.ndarray:
    """Mean absolute second difference along rows, per image: ~0 for linear gradients, large for textures."""
    x = images.astype(np.float32)
    return np.abs(x[:, :, 2:] - 2 * x[:, :, 1:-1] + x[:, :, :-2]).mean(axis=(1, 2, 3))


def test_smooth_backgrounds_are_gradients_and_keep_the_same_shapes():
    """The smooth variant's images vary far less locally; labels follow the same index rule."""
    smooth, labels = render_batch(seed=7, start=0, count=32, cfg=ShapesConfig(background="smooth"))
    textured, labels2 = render_batch(seed=7, start=0, count=32)
    np.testing.assert_array_equal(labels, labels2)
    assert np.median(second_difference(smooth)) < 0.5 * np.median(second_difference(textured))  # edges remain
    with pytest.raises(ValueError, match="background must be one of"):
        ShapesConfig(background="plaid")


def test_shape_is_large_enough_to_survive_16x16_tokens():
    """The shape's pixels (measured by rendering twice with the same rng but different class) cover a big area."""
    cfg = ShapesConfig()
    areas = []
    for i in range(16):
        img_a = render(0, image_rng(11, i), cfg)
        img_b = render(1, image_rng(11, i), cfg)  # same background and colour draws, different outline
        areas.append((np.abs(img_a.astype(int) - img_b.astype(int)).sum(-1) > 30).mean())
    assert np.median(areas) > 0.08


def test_dataset_items_are_tensors_in_minus_one_one():
    ds = ShapesDataset(length=10, seed=0)
    x, y = ds[3]
    assert x.shape == (3, 64, 64) and float(x.min()) >= -1.0 and float(x.max()) <= 1.0 and y == 3
    with pytest.raises(IndexError):
        ds[10]


def test_to_tensor_maps_uint8_to_minus_one_one():
    t = to_tensor(np.array([[[[0, 255, 127]]]], dtype=np.uint8))
    assert t.shape == (1, 3, 1, 1)
    assert t.flatten().tolist() == pytest.approx([-1.0, 1.0, 127 / 127.5 - 1])


def test_bad_class_and_config_raise():
    with pytest.raises(ValueError, match="class_id must be in"):
        render(NUM_CLASSES, image_rng(0, 0))
    with pytest.raises(ValueError, match="min_scale"):
        ShapesConfig(min_scale=0.9, max_scale=0.5)


def test_cached_split_renders_once_and_reuses(tmp_path):
    images, labels = cached_split(tmp_path, "val", 12, workers=1)
    again, labels2 = cached_split(tmp_path, "val", 8, workers=1)
    np.testing.assert_array_equal(images[:8], again)
    np.testing.assert_array_equal(labels[:8], labels2)
    expected, _ = sample_image(1, 4)  # the val split is seed 1
    np.testing.assert_array_equal(images[4], expected)
    with pytest.raises(ValueError, match="unknown split"):
        cached_split(tmp_path, "holdout", 4)


def test_a_larger_cached_split_renders_only_the_images_the_cache_lacks(tmp_path, monkeypatch):
    import vgen.data.shapes as shapes

    cached_split(tmp_path, "val", 5, workers=1)
    calls = []
    render_to_arrays = shapes.render_to_arrays
    monkeypatch.setattr(shapes, "render_to_arrays",
                        lambda seed, count, *a, **k: calls.append((count, k["first"])) or
                        render_to_arrays(seed, count, *a, **k))
    images, labels = cached_split(tmp_path, "val", 11, workers=1)
    assert calls == [(6, 5)]
    assert images.shape[0] == labels.shape[0] == 11
    for i in (0, 4, 5, 10):
        image, label = sample_image(1, i)
        np.testing.assert_array_equal(images[i], image)
        assert labels[i] == label
    again, _ = cached_split(tmp_path, "val", 11, workers=1)  # now cached in full
    np.testing.assert_array_equal(again, images)
    assert calls == [(6, 5)]


def test_a_data_folder_records_its_rendering_config_and_refuses_to_change_it(tmp_path):
    assert data_config(tmp_path) == ShapesConfig()  # nothing recorded: the default
    smooth = ShapesConfig(background="smooth")
    set_data_config(tmp_path, smooth)
    images, _ = cached_split(tmp_path, "val", 4, workers=1)
    np.testing.assert_array_equal(images[2], sample_image(1, 2, smooth)[0])
    set_data_config(tmp_path, smooth)  # the same config again is fine
    with pytest.raises(ValueError, match="already holds images rendered with"):
        set_data_config(tmp_path, ShapesConfig())
