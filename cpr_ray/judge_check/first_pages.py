"""The citing paper's title and abstract, read from the first pages of its PDF.

The gold's real cases pair a citing sentence with the citing paper's own title and abstract, the
two texts a build sends the judge about q. The citation set ships them only as the first two pages
of each PDF as `pdftotext -l 2` prints them (running heads, licences, affiliations and the start
of the introduction around them), so this module finds the two texts there and copies them.

Rules, so that anyone can check a text against its page:
- Lines are joined with one space. A line ending in a hyphen right after a letter joins the next
  line without a space; the hyphen is kept when the hyphenated compound is printed whole
  elsewhere on the pages or the next line starts in upper case ("DS-" + "DAT"), and dropped
  otherwise (a word the typesetter broke). Nothing else is changed: characters, ligatures and
  capitals are copied as printed; an `arXiv:` margin stamp line is not part of any text.
- Title: the longest run of the pages' words that matches, in order and case-insensitively, a run
  of the title the citation set records (that record is often noisy: a running head or the
  article type before the title, a title printed twice), its first occurrence, copied from the
  page. When no run covers 60% of the recorded words, the first block of lines set in capitals
  with three words or more (a title in capitals); else the recorded title, said so in
  `title_from_page`.
- Abstract: after a heading line "Abstract" / "ABSTRACT" / "a b s t r a c t" / "Summary" (its text
  may follow on the same line; blank lines and side-column labels such as "Article history:" are
  skipped), or, without a heading, from the first line after the title that starts two long
  lines of prose (words, not spaced capitals) free of addresses, licence and reprint notes. It
  ends at the first blank line (unless the text so far ends in a broken word), or at a line
  opening keywords, an introduction, a received date, a copyright, a citation or editor note, or
  a translated abstract. A structured abstract that a column or page break interrupts is thus
  cut there.
- No abstract (None) for an erratum or a letter to the editor, which have none, and when no start
  is found.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path

TITLE_MIN_COVER = 0.6
TITLE_MIN_WORDS = 3
TITLE_GAP = 2
MIN_LOWER_WORDS = 0.3  # names and title-case lines are not prose
PROSE_LINE_CHARS = 40
MIN_MEAN_WORD_CHARS = 2.5  # spaced capitals ("C R E AT I N G") are not prose

_WORD = re.compile(r"[^\W_]+")
_STAMP = re.compile(r"^\s*arXiv:\S+")
_HEADING = re.compile(
    r"^\s*(?:a\s?b\s?s\s?t\s?r\s?a\s?c\s?t|summary)\b\s*[.:]?\s*(?P<rest>.*)$", re.IGNORECASE
)
_END = re.compile(
    r"^\s*(?:key\s?words?\b|index terms|palabras clave|resumen|r[ée]sum[ée]|zusammenfassung"
    r"|(?:\d+\.?\s*)?(?:introduction|background)\s*$|introduction\s*$|received\b|©|copyright"
    r"|article history|mathematics subject|citation:|editor:|\*\s*correspond|.*@|.*e-mail"
    r"|electronic supplementary)",
    re.IGNORECASE,
)
_NOT_PROSE = re.compile(
    r"@|https?:|www\.|doi|copyright|©|licen[cs]e|permits unrestricted|properly cited"
    r"|correspondence|universit(?:y|ät|é|à|ad)|department|\binstitut(?:e|o|ion)?\b"
    r"|(?:received|revised|accepted|published)(?: online)?:? \d|e-mail"
    r"|this content was|original publication|when citing|to cite|article history",
    re.IGNORECASE,
)
_SECTION = re.compile(
    r"^\s*(?:(?:\d+\.?\s*)?introduction|acknowledge?ments?|conflicts? of interest)\s*$",
    re.IGNORECASE,
)
_NO_ABSTRACT = re.compile(r"^\s*(?:erratum|to the editor)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class FirstPage:
    """What was read from one citing paper's first pages."""

    title: str
    title_from_page: bool
    abstract: str | None


def join_lines(lines: Sequence[str], page: str = "") -> str:
    """Join printed lines into one text by the module's de-hyphenation rule.

    `page` is the whole text the lines come from: a compound printed whole there keeps its hyphen.
    """
    text = ""
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if not text:
            text = line
            continue
        broken = re.search(r"([^\W\d_]+)-$", text)
        if broken is None:
            text = f"{text} {line}"
            continue
        head = broken.group(1)
        tail = _WORD.match(line)
        compound = f"{head}-{tail.group(0)}" if tail else ""
        keep = not line[0].islower() or (compound and compound.lower() in page.lower())
        text = (text if keep else text[:-1]) + line
    return text


def _tokens(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


def _best_title_match(page: list[re.Match[str]], wanted: list[str]) -> tuple[int, int, int] | None:
    """(matched words, first page word, last page word) of the best match of `wanted` in `page`.

    The page's words are aligned with the recorded title's (difflib); matched blocks at most
    `TITLE_GAP` page words apart form one candidate (a symbol the record lost, two words the PDF
    glued), and the candidate with most matched words wins.
    """
    blocks = SequenceMatcher(None, [t.group(0).lower() for t in page], wanted, autojunk=False)
    best: tuple[int, int, int] | None = None
    run: tuple[int, int, int] | None = None
    for block in blocks.get_matching_blocks():
        if not block.size:
            continue
        last = block.a + block.size - 1
        if run is not None and block.a - run[2] - 1 <= TITLE_GAP:
            run = (run[0] + block.size, run[1], last)
        else:
            run = (block.size, block.a, last)
        if best is None or run[0] > best[0]:
            best = run
    return best


def _title_span(text: str, recorded: str) -> tuple[int, int] | None:
    """The character span of the page's last best match of the recorded title's words.

    The last that opens a line, because cover pages and citation boxes print the title before
    the paper does (and a running head prints it after, behind the authors' names).
    """
    wanted = [w.lower() for w in _WORD.findall(recorded)]
    page = _tokens(text)
    if not wanted or not page:
        return None
    best = _best_title_match(page, wanted)
    if best is None or best[0] < TITLE_MIN_WORDS or best[0] < TITLE_MIN_COVER * len(set(wanted)):
        return None
    chosen, offset = best, best[2] + 1
    while True:
        later = _best_title_match(page[offset:], wanted)
        if later is None or later[0] < best[0]:
            break
        later = (later[0], later[1] + offset, later[2] + offset)
        start = page[later[1]].start()
        if not text[text.rfind("\n", 0, start) + 1 : start].strip():
            chosen = later
        offset = later[2] + 1
    return page[chosen[1]].start(), page[chosen[2]].end()


def _clean(line: str) -> bool:
    """A long line of words, not an address, a licence, a name list or spaced capitals."""
    words = _WORD.findall(line)
    return (
        len(line.strip()) >= PROSE_LINE_CHARS
        and not _NOT_PROSE.search(line)
        and bool(words)
        and sum(map(len, words)) / len(words) >= MIN_MEAN_WORD_CHARS
    )


def _capitals_title(lines: Sequence[str]) -> tuple[int, int] | None:
    """The first block of lines set in capitals, three words or more (a title in capitals).

    Blank lines inside the block are allowed: a margin stamp removed from the page leaves one.
    """

    def caps(line: str) -> bool:
        words = _WORD.findall(line)
        letters = [c for c in line if c.isalpha()]
        return (
            len(words) >= 2
            and not _NOT_PROSE.search(line)
            and sum(map(len, words)) / len(words) >= MIN_MEAN_WORD_CHARS
            and sum(c.isupper() for c in letters) >= 0.8 * len(letters)
        )

    for start, line in enumerate(lines):
        if caps(line):
            end = start + 1
            while True:
                nxt = next((j for j in range(end, len(lines)) if lines[j].strip()), None)
                if nxt is None or not caps(lines[nxt]):
                    break
                end = nxt + 1
            return start, end
    return None


def _abstract_start(lines: Sequence[str], after: int, title: str) -> tuple[int, str] | None:
    """Where the abstract's text begins: a line index and the text on it after any heading.

    A paragraph that repeats the title is a reference to the paper (a reprint note), not its
    abstract.
    """
    title_words = [w.lower() for w in _WORD.findall(title)]
    for i, line in enumerate(lines):
        match = _HEADING.match(line)
        if match:
            if match.group("rest"):
                return i, match.group("rest")
            nxt = next((j for j in range(i + 1, len(lines)) if _clean(lines[j])), None)
            return None if nxt is None else (nxt, lines[nxt])
    for i in range(after, len(lines) - 2):
        if _SECTION.match(lines[i]):
            return None  # the paper's body has begun: no abstract before it
        run = lines[i : i + 3]
        if not (_clean(run[0]) and _clean(run[1]) and run[2].strip()) or _END.match(run[0]):
            continue
        words = _WORD.findall(" ".join(run))
        paragraph = " ".join(itertools.takewhile(str.strip, lines[i:]))
        if (
            not _NOT_PROSE.search(run[2])
            and " ".join(title_words) not in " ".join(w.lower() for w in _WORD.findall(paragraph))
            and sum(w[0].islower() for w in words) >= MIN_LOWER_WORDS * len(words)
            and re.search(r"[.;:](\s|$)", paragraph)
        ):
            return i, lines[i]
    return None


def read_first_page(text: str, recorded_title: str) -> FirstPage:
    """The citing paper's title and abstract from its first pages' text (rules: the module doc)."""
    text = "\n".join(line for line in text.splitlines() if not _STAMP.match(line))
    lines = text.splitlines()
    span = _title_span(text, recorded_title)
    after = 0
    if span is not None:
        title = join_lines(text[span[0] : span[1]].splitlines(), text)
        after = text.count("\n", 0, span[1]) + 1
    else:
        caps = _capitals_title(lines)
        title = join_lines(lines[caps[0] : caps[1]], text) if caps else recorded_title.strip()
        after = caps[1] if caps else 0
    from_page = span is not None or title != recorded_title.strip()
    if any(_NO_ABSTRACT.match(line) for line in lines):
        return FirstPage(title, from_page, None)
    start = _abstract_start(lines, after, title)
    if start is None:
        return FirstPage(title, from_page, None)
    first, head = start
    body = [head]
    for line in lines[first + 1 :]:
        if not line.strip():
            if body[-1].rstrip().endswith("-"):
                continue
            break
        if _END.match(line):
            break
        body.append(line)
    return FirstPage(title, from_page, join_lines(body, text))


def read_first_page_file(path: Path, recorded_title: str) -> FirstPage:
    """`read_first_page` over a `citing-first-pages/<core_id>.txt` file."""
    return read_first_page(path.read_text(encoding="utf-8"), recorded_title)
