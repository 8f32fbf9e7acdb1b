"""The docs as a reader meets them: short enough to read, every relative link and anchor resolves, and
no tracker numbers (issue, session, stop) in the docs or the code. Pure file reads: seconds."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # seconds: run before every commit

REPO = Path(__file__).resolve().parents[1]

#: the model card of the embedded default, which the page and README link for it
MODEL_CARD = REPO / "assets" / "models" / "tiny-shapes" / "README.md"
#: README, every page under docs/ and the card: what a reader is sent to
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), MODEL_CARD]
#: the words all of PAGES may hold together: history lives in git and result files
MAX_WORDS = 20_000

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def words(text: str) -> int:
    """Words as a reader counts them: whitespace-separated tokens holding a letter or a digit (a table's
    ``|`` and ``---`` are markup, not words; code in the page counts, it is reading matter too)."""
    return sum(1 for token in text.split() if re.search(r"[^\W_]", token))


def prose(text: str) -> str:
    """The text with fenced and inline code removed (a link or a number in code is code's business)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set(_HTML_ID.findall(text))
    for _, heading in _HEADING.findall(_FENCE.sub("", text)):
        base = anchor(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file is missing, or whose #anchor no heading of its page makes."""
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(_FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:: not followed here
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading makes #{fragment}")
    return broken


def test_the_word_count_counts_words_not_markup():
    assert words("| id | a `tiny-shapes` model |\n|---|---|\n12 steps, 3.0 -> 1") == 8


def test_readme_docs_and_the_model_card_fit_the_word_budget():
    counts = {str(page.relative_to(REPO)): words(page.read_text(encoding="utf-8")) for page in PAGES}
    assert MODEL_CARD.exists() and sum(counts.values()) <= MAX_WORDS, sorted(counts.items(), key=lambda c: -c[1])


def test_every_relative_link_and_anchor_resolves():
    broken = {str(page.relative_to(REPO)): found for page in [*PAGES, REPO / "tests" / "README.md"]
              if (found := broken_links(page))}
    assert broken == {}


def test_every_docs_anchor_the_code_names_resolves():
    """Comments, docstrings and messages in the code that point at ``docs/<page>.md#<anchor>``."""
    named = {(path.relative_to(REPO), match) for path in _sources() if path.suffix == ".py" and path.name != "test_docs.py"
             for match in re.findall(r"docs/[\w.-]+\.md#[\w-]+", path.read_text(encoding="utf-8"))}
    assert named, "the code names no docs anchor: the pattern no longer matches"
    broken = []
    for source, target in sorted(named):
        page, fragment = target.split("#")
        if not (REPO / page).exists() or fragment not in anchors((REPO / page).read_text(encoding="utf-8")):
            broken.append(f"{source}: {target}")
    assert broken == []


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Styles: `outline` and `shaded` (LoRA, hot-swapped)\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#styles-outline-and-shaded-lora-hot-swapped) [top](#a-title) "
                    "![img](other.md) [web](https://example.com/x.md#nowhere)\n"
                    "# A title\n\n```\n[in code](missing.md)\n```\n"
                    "[gone](missing.md) [bad anchor](other.md#no-such-heading) [here](#nowhere)\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#no-such-heading: no heading makes #no-such-heading",
                                  "#nowhere: no heading makes #nowhere"]


def test_readme_and_the_about_panel_link_the_model_card():
    """README's first screen links the card; the About panel names it for tiny-shapes and links a hub
    model's page (a stand-in with random weights has none)."""
    from tpu_demo.core.catalog import CATALOG
    from tpu_demo.web.about import about_markdown

    first_screen = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "(assets/models/tiny-shapes/README.md)" in first_screen and "(docs/tpu-host.md)" in first_screen
    assert (REPO / CATALOG["tiny-shapes"].card) == MODEL_CARD
    facts = {"device": "CPU", "device_kind": "cpu", "chips": 0, "versions": {}, "compile_backend": "inductor",
             "compile_cache": {}, "models": {model_id: {"title": model_id, "placement": "whole"}
                                             for model_id in ("tiny-shapes", "flux.1-schnell", "tiny-flux")}}
    rows = about_markdown(facts).splitlines()[-3:]
    assert rows == ["| tiny-shapes | whole | `assets/models/tiny-shapes/README.md` |",
                    "| flux.1-schnell | whole | [black-forest-labs/FLUX.1-schnell]"
                    "(https://huggingface.co/black-forest-labs/FLUX.1-schnell) |",
                    "| tiny-flux | whole | - |"]


#: a tracker number: "#19" (not a colour, an entity or an anchor: one or two digits, nothing word-like
#: around it), or "issue 19", "issues #34 and #37", "session 3", "stop 49", "PR 12"
TRACKER_NUMBER = re.compile(
    r"(?<![\w&#/\-\]])#\d{1,2}(?![\w;])"
    r"|\b(?:issues?|sessions?|stops?|PRs?|pull requests?)\s+#?\d+\b", re.I)
#: files that may say such a thing, with the reason
ALLOWED = {"tests/test_docs.py": "the pattern's own examples"}


def tracker_numbers(text: str) -> list[str]:
    return [match.group(0) for match in TRACKER_NUMBER.finditer(text)]


def _sources() -> list[Path]:
    code = [path for folder in ("tpu_demo", "tiny_shapes", "scripts", "tests", "benchmarks", "space", "deploy")
            for path in sorted((REPO / folder).rglob("*")) if path.is_file()
            and path.suffix in (".py", ".md", ".sh", ".yaml", ".yml", ".conf", ".txt", ".toml", ".json")]
    return [*PAGES, REPO / "tests" / "README.md", REPO / "app.py", REPO / "Dockerfile", *code]


def test_no_issue_session_or_stop_numbers_in_docs_or_code():
    found = {}
    for path in _sources():
        name = str(path.relative_to(REPO))
        if name in ALLOWED or "results" in path.parts:  # benchmarks/results: recorded runs, not prose
            continue
        if hits := tracker_numbers(path.read_text(encoding="utf-8", errors="replace")):
            found[name] = hits
    assert found == {}


@pytest.mark.parametrize("text, hits", [
    ("the target of issue #19's work", ["issue #19"]), ("issue 54 asks", ["issue 54"]), ("Since stop 49 the", ["stop 49"]),
    ("(session 3)", ["session 3"]), ("issues #34 and #37", ["issues #34", "#37"]), ("see PR 12", ["PR 12"]),
    ("color: #333; background: #1f2937", []), ("&#39; &#8217;", []), ("[x](page.md#3-steps)", []),
    ("seed 7, image 2 of 4, step 3/12", []), ("Stop ends the run: 2 of 4 images", []), ("issue a request", []),
])
def test_the_tracker_number_pattern(text, hits):
    assert tracker_numbers(text) == hits
