"""The README and docs/ as a reader meets them: every relative link and picture resolves (anchors included), the
README stays a short user's guide, every embedded model has a model card, and no document, module, test or script
narrates the project's own past by numbered work periods."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
README_MAX_BYTES = 13 * 1024
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
"""PyTorch's CPU wheel, as the install page at pytorch.org writes the command."""
# numbered work periods: the word session(s) before a number, a section sign before a number
HISTORY = re.compile(r"\bsessions?[ -]\d|\u00a7\s?\d", re.I)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text(encoding="utf-8")))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_readme_is_a_short_guide_with_the_ci_commands() -> None:
    """The README installs PyTorch's CPU wheel as PyTorch's install page writes it; ``.ci/run`` runs the README's
    test command after a torch pin of its own, which it says is there for CI."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= README_MAX_BYTES
    assert f"{CPU_TORCH} && pip install -e . && vgen sample" in text
    tests = text.split("## Run the tests", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", tests, re.S).group(1)
    assert command == f'{CPU_TORCH} && pip install -e ".[dev,triton]" && pytest -q'
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command.removeprefix(f"{CPU_TORCH} && ") in ci and "pip install torch==2.13.0" in ci
    assert "torch==" not in text


def test_every_embedded_model_has_a_card_linked_from_the_index() -> None:
    models = sorted(p.name for p in (ROOT / "vgen" / "assets").iterdir() if p.is_dir())
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    assert models
    for name in models:
        assert (ROOT / "docs" / "models" / f"{name}.md").is_file(), name
        assert f"(models/{name}.md)" in index, name


def test_the_index_links_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    pages = [p for p in (ROOT / "docs").rglob("*.md") if p != index and "results" not in p.parts]
    assert [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked] == []


def test_every_result_file_is_shown_by_a_page() -> None:
    """A result file under docs/results is named by a page, which names its command; the files of one command's
    output folder (``vgen bench --out``, ``benchmarks/streaming.py --out``, ``benchmarks/compiled_speed.py --out``)
    are named by their folder."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES if "results" not in p.parts)
    results = ROOT / "docs" / "results"

    def named(f: Path) -> bool:
        folder = f.parent.relative_to(results).as_posix()
        return (f"results/{f.relative_to(results).as_posix()}" in text
                or (folder.startswith(("bench", "streaming", "speed/compiled")) and f"results/{folder}" in text))

    unshown = [str(f.relative_to(results)) for f in results.rglob("*") if f.is_file() and not named(f)]
    assert unshown == []


def test_no_numbered_work_periods_anywhere() -> None:
    files = [*PAGES, *(p for d in ("vgen", "tests", "benchmarks") for p in (ROOT / d).rglob("*")
                       if p.suffix in (".py", ".sh", ".md"))]
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in files
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert hits == []


def test_history_pattern_catches_what_it_must() -> None:
    assert HISTORY.search("trained in session" " 21") and HISTORY.search("(sessions" " 27-28)")
    assert HISTORY.search("docs/training.md \u00a710j") and not HISTORY.search('scope="session"')
