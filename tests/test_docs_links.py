"""The README and docs/*.md: every relative link points at a file of this repository (and, for
a `#anchor`, at a heading of the markdown file it names), and the README stays a short
front door. Only files inside the repository are read."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```+|~~~+)")
INLINE_CODE = re.compile(r"`[^`]*`")
# [text](target) or [text](target "title"); images (![alt](target)) match too
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blank_code(text: str, *, inline: bool = True) -> str:
    """The text with fenced code blocks (and, with `inline`, inline code spans) replaced by
    blanks, newlines kept: links quoted as code are not checked, a `# comment` in a shell block
    is no heading, and line numbers stay right."""
    out, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    text = "\n".join(out)
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text) if inline else text


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    # inline code stays: a heading's code text is part of its anchor
    for line in blank_code(path.read_text(encoding="utf-8"), inline=False).split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links_in(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link in markdown text, outside code."""
    text = blank_code(text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken_links() -> list[str]:
    problems = []
    cache: dict[Path, set[str]] = {}
    for doc in doc_files():
        for line, target in links_in(doc.read_text(encoding="utf-8")):
            if EXTERNAL.match(target):
                continue
            where = f"{doc.relative_to(ROOT)}:{line}: {target}"
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            try:
                dest.relative_to(ROOT)
            except ValueError:
                problems.append(f"{where} (outside the repository)")
                continue
            if not dest.exists():
                problems.append(f"{where} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and dest.is_file():
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor.lower() not in cache[dest]:
                    problems.append(f"{where} (no heading with anchor #{anchor} in {dest.relative_to(ROOT)})")
    return problems


def test_docs_exist():
    assert (ROOT / "README.md").is_file()
    assert len(doc_files()) > 1


def test_relative_links_resolve():
    problems = broken_links()
    assert not problems, f"{len(problems)} broken link(s):\n" + "\n".join(problems)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, at most {README_MAX_LINES}: move reference text to docs/"


def test_slug_matches_github():
    assert slug("Why is my accelerator idle? `spanflow doctor`") == "why-is-my-accelerator-idle-spanflow-doctor"
    assert slug("Long documents: the inference window and `--pack`") == "long-documents-the-inference-window-and---pack"
    assert slug("Relation extraction (CasRel): WebNLG, all-MiniLM-L6-v2") == \
        "relation-extraction-casrel-webnlg-all-minilm-l6-v2"
    assert slug("`--head crf`: a CRF over the word tags") == "--head-crf-a-crf-over-the-word-tags"


def test_link_finder_skips_code_and_external():
    text = ("See [a](a.md) and [b](https://example.com) and `[c](c.md)`.\n"
            "```\n[d](d.md)\n```\n"
            "[e](e.md#x) [f](#y)\n")
    assert links_in(text) == [(1, "a.md"), (1, "https://example.com"), (5, "e.md#x"), (5, "#y")]
