"""Prompt sets: the four readers on small files written here (plain text, COCO captions, PartiPrompts' TSV,
GenEval's metadata), their ids and categories, COCO's one caption per image, seeded subsets, format detection, and
one line naming the file for every mistake."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from vgen.data.prompts import FORMATS, PromptSet, read_prompt_set
from vgen.pipelines.inputs import read_prompt_file

# 6 images with 2 to 4 captions each, the captions of an image scattered through the list as in COCO's files
COCO_CAPTIONS = {391895: ["A man on a bike.", "A cyclist on a dirt road. ", "A person riding\n a bicycle."],
                 522418: ["A woman cutting a cake.", "Someone slices a large cake."],
                 184613: ["A boy with an umbrella.", "A child holds a red umbrella.", "Kid in the rain.",
                          "An umbrella over a small boy."],
                 318219: ["A computer on a desk.", "A monitor and a keyboard."],
                 554625: ["A boy playing tennis.", "A young tennis player swings.", "Tennis on a court."],
                 397133: ["A kitchen with a stove.", "Pots on a stove in a kitchen."]}


def coco_annotations() -> list[dict]:
    rounds = max(len(c) for c in COCO_CAPTIONS.values())
    return [{"image_id": image, "id": 1000 * k + image % 1000, "caption": captions[k]}
            for k in range(rounds) for image, captions in COCO_CAPTIONS.items() if k < len(captions)]


@pytest.fixture
def coco(tmp_path):
    path = tmp_path / "captions_val2014.json"
    images = [{"id": image, "file_name": f"COCO_val2014_{image:012d}.jpg"} for image in COCO_CAPTIONS]
    path.write_text(json.dumps({"info": {}, "images": images, "annotations": coco_annotations()}))
    return path


PARTI = ('Prompt\tCategory\tChallenge\tNote\n'
         'bond\tAbstract\tBasic\t\n'
         'A red apple next to a green pear.\tFood & Beverage\tColors\tcounts two\n'
         '"A sign that says\n""Deep Learning""."\tArtifacts\tWriting & Symbols\t\n'
         '\n'
         'a teddy bear on a skateboard in times square\tAnimals\tImagination\t\n')


@pytest.fixture
def parti(tmp_path):
    path = tmp_path / "PartiPrompts.tsv"
    path.write_text(PARTI)
    return path


GENEVAL = [{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
           {"tag": "two_object", "include": [], "prompt": "a photo of a cat and a dog"},
           {"tag": "counting", "include": [], "prompt": "a photo of three apples"},
           {"tag": "colors", "include": [], "prompt": "a photo of a blue car"}]


@pytest.fixture
def geneval(tmp_path):
    path = tmp_path / "evaluation_metadata.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GENEVAL))
    return path


def test_a_text_file_is_one_prompt_a_line_with_its_line_number_as_id(tmp_path):
    path = tmp_path / "captions.txt"
    path.write_text("\n  a red star  \n\n\ta blue\t\tring\r\n   \n")
    s = read_prompt_set(path)
    assert (s.prompts, s.ids, s.format, s.source) == (("a red star", "a blue ring"), ("2", "4"), "text", str(path))
    assert s.categories is None and s.challenges is None and len(s) == 2
    assert read_prompt_file(path) == ["a red star", "a blue ring"]  # the pipelines' reader is this one


def test_a_coco_file_gives_one_caption_of_every_image_with_its_image_id(coco):
    s = read_prompt_set(coco)
    assert s.format == "coco" and s.categories is None and s.challenges is None
    assert s.ids == tuple(str(image) for image in COCO_CAPTIONS)  # every image once, in the order it first appears
    assert all(p in [" ".join(c.split()) for c in COCO_CAPTIONS[int(i)]] for p, i in zip(s.prompts, s.ids))
    assert (s.subset_size, s.subset_seed) == (None, 0)
    picks = {seed: read_prompt_set(coco, seed=seed).prompts for seed in range(8)}
    assert len(set(picks.values())) > 1  # the caption of each image is the seed's choice


def test_a_coco_subset_is_one_caption_per_image_seeded_and_deterministic(coco):
    a = read_prompt_set(coco, subset=4, seed=3)
    assert len(a) == 4 and len(set(a.ids)) == 4 and (a.subset_size, a.subset_seed) == (4, 3)
    assert all(p in [" ".join(c.split()) for c in COCO_CAPTIONS[int(i)]] for p, i in zip(a.prompts, a.ids))
    order = [str(image) for image in COCO_CAPTIONS]
    assert sorted(a.ids, key=order.index) == list(a.ids)  # kept in the file's order
    assert read_prompt_set(coco, subset=4, seed=3) == a
    draws = {read_prompt_set(coco, subset=4, seed=seed) for seed in range(6)}
    assert len({d.ids for d in draws}) > 1 and len({d.prompts for d in draws}) > 1
    larger = read_prompt_set(coco, subset=5, seed=3)  # with one seed a smaller subset lies within a larger one
    assert set(zip(a.ids, a.prompts)) <= set(zip(larger.ids, larger.prompts))
    assert read_prompt_set(coco, seed=3).subset(4, 3).ids == a.ids


def test_coco_subsets_draw_images_and_captions_uniformly():
    """Over seeds, each of 3 images is in a subset of 2 about 2/3 of the time, each of its captions about equally."""
    s = PromptSet(("a1", "b1", "a2", "c1", "b2"), ("a", "b", "a", "c", "b"), None, None, "coco", "mem")
    counts = Counter(p for seed in range(3000) for p in s.subset(2, seed).prompts)
    assert all(abs(counts[p] - 1000) < 100 for p in ("a1", "a2", "b1", "b2"))
    assert abs(counts["c1"] - 2000) < 100


def test_parti_keeps_categories_challenges_and_quoted_prompts(parti):
    s = read_prompt_set(parti)
    assert s.format == "parti" and s.ids == ("1", "2", "3", "4")
    assert s.prompts == ("bond", "A red apple next to a green pear.", 'A sign that says "Deep Learning".',
                         "a teddy bear on a skateboard in times square")
    assert s.categories == ("Abstract", "Food & Beverage", "Artifacts", "Animals")
    assert s.challenges == ("Basic", "Colors", "Writing & Symbols", "Imagination")


def test_geneval_keeps_its_tags_as_categories(geneval):
    s = read_prompt_set(geneval)
    assert s.format == "geneval" and s.challenges is None and s.ids == ("1", "2", "3", "4")
    assert s.prompts == tuple(r["prompt"] for r in GENEVAL)
    assert s.categories == ("single_object", "two_object", "counting", "colors")


def test_a_subset_of_the_other_formats_is_distinct_prompts_in_file_order_with_their_columns(parti, geneval):
    s = read_prompt_set(parti, subset=2, seed=1)
    full = read_prompt_set(parti)
    rows = [full.ids.index(i) for i in s.ids]
    assert len(s) == 2 and rows == sorted(set(rows))
    assert s.categories == tuple(full.categories[r] for r in rows)
    assert s.challenges == tuple(full.challenges[r] for r in rows)
    assert s == read_prompt_set(parti, subset=2, seed=1)
    assert len({read_prompt_set(geneval, subset=2, seed=seed).ids for seed in range(10)}) > 1
    assert read_prompt_set(geneval, subset=4, seed=7).prompts == read_prompt_set(geneval).prompts


@pytest.mark.parametrize("name, content, expected", [
    ("prompts", "a red star\na blue ring\n", "text"),
    ("captions", json.dumps({"annotations": [{"image_id": 1, "id": 2, "caption": "a cat"}]}), "coco"),
    ("parti", PARTI, "parti"),
    ("meta", json.dumps(GENEVAL[0]) + "\n", "geneval"),
    ("prompts.TXT", PARTI, "text"),  # the suffix decides where there is one
])
def test_the_format_is_detected_from_the_suffix_or_else_the_content(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    assert read_prompt_set(path).format == expected


def test_a_given_format_overrides_the_detection(tmp_path, geneval):
    path = tmp_path / "parti.txt"
    path.write_text(PARTI)
    assert read_prompt_set(path, format="parti").categories[0] == "Abstract"
    assert read_prompt_set(geneval, format="text").prompts[0] == json.dumps(GENEVAL[0])


@pytest.mark.parametrize("name, content, kwargs, message", [
    ("missing.txt", None, {}, "cannot read prompt file {path}: No such file or directory"),
    ("bad.txt", b"a red \xff star\n", {}, "prompt file {path} is not UTF-8 text (byte 6)"),
    ("empty.txt", "\n  \n", {}, "prompt file {path} holds no prompts: write one prompt a line"),
    ("instances.json", {"images": [], "annotations": [{"image_id": 1, "id": 1, "bbox": [0, 0, 1, 1]}]}, {},
     "prompt file {path} is not a COCO caption file: annotation 1 has no caption"),
    ("other.json", {"images": [], "captions": []}, {},
     'prompt file {path} is not a COCO caption file: it has no "annotations" list'),
    ("broken.json", "{", {}, "prompt file {path} is not JSON"),
    ("blank.json", {"annotations": [{"image_id": 1, "id": 7, "caption": "a cat"},
                                    {"image_id": 2, "id": 8, "caption": "  "}]}, {},
     "prompt file {path}: annotation 2 (id 8, image 2) has an empty caption"),
    ("none.json", {"annotations": []}, {}, "prompt file {path} holds no captions"),
    ("plain.tsv", "text\tlabel\na cat\tanimal\n", {}, "prompt file {path} is not a PartiPrompts table: its header "
                                                      "has no Prompt column"),
    ("gap.tsv", "Prompt\tCategory\na cat\tAnimals\n\tAnimals\n", {}, "prompt file {path}: row 2 has an empty prompt"),
    ("header.tsv", "Prompt\tCategory\n", {}, "prompt file {path} holds no prompts: it has only its header"),
    ("tagless.jsonl", '{"prompt": "a cat"}\n', {}, "prompt file {path} is not GenEval metadata: line 1 has no 'tag'"),
    ("list.jsonl", '{"prompt": "a cat", "tag": "x"}\n[1]\n', {},
     "prompt file {path} is not GenEval metadata: line 2 has no 'prompt'"),
    ("nojson.jsonl", '{"prompt": "a cat", "tag": "x"}\n\nnot json\n', {},
     "prompt file {path}: line 3 is not JSON"),
    ("blank.jsonl", '{"prompt": "a cat", "tag": "x"}\n{"prompt": " ", "tag": "x"}\n', {},
     "prompt file {path}: line 2 has an empty prompt"),
    ("big.txt", "a\nb\nc\n", {"subset": 4}, "prompt file {path}: a subset of 4 cannot be drawn from its 3 prompts "
                                            "(give 1 to 3)"),
    ("zero.txt", "a\nb\nc\n", {"subset": 0}, "prompt file {path}: a subset of 0 cannot be drawn"),
    ("coco.json", {"annotations": [{"image_id": 1, "id": 1, "caption": "a"}, {"image_id": 1, "id": 2, "caption": "b"}]},
     {"subset": 2}, "prompt file {path}: a subset of 2 cannot be drawn from its 1 images"),
    ("seed.txt", "a\nb\n", {"subset": 1, "seed": -1}, "a subset seed must be a non-negative integer, got -1"),
    ("fmt.txt", "a\n", {"format": "csv"}, "unknown prompt file format 'csv': use one of text, coco, parti, geneval"),
])
def test_bad_input_is_one_line_naming_the_file_and_the_problem(tmp_path, name, content, kwargs, message):
    path = tmp_path / name
    if isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as e:
        read_prompt_set(path, **kwargs)
    assert str(e.value).startswith(message.format(path=path)) and "\n" not in str(e.value), str(e.value)


def test_a_prompt_set_checks_its_columns_and_format():
    assert FORMATS == ("text", "coco", "parti", "geneval")
    with pytest.raises(ValueError, match="a prompt set's ids must be one per prompt: 1 for 2 prompts"):
        PromptSet(("a", "b"), ("1",), None, None, "text", "mem")
    with pytest.raises(ValueError, match="unknown prompt file format 'csv'"):
        PromptSet(("a",), ("1",), None, None, "csv", "mem")
