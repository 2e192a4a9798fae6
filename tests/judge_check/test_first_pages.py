"""The citing paper's title and abstract read from its first pages (`judge_check.first_pages`).

The pages are the citation set's, in the team's reference folder beside the checkout; the
expected texts were checked by eye against each page.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cpr_ray.judge_check.first_pages import join_lines, read_first_page_file

CITATIONS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "citation-contexts"
PAGES = CITATIONS / "citing-first-pages"


def test_a_broken_word_loses_its_hyphen_and_a_printed_compound_keeps_it() -> None:
    assert join_lines(["a treat-", "ment is given"]) == "a treatment is given"
    assert join_lines(["the DS-", "DAT scale"]) == "the DS-DAT scale"
    page = "speciation-with-gene-flow elsewhere"
    assert join_lines(["speciation-with-", "gene-flow"], page) == "speciation-with-gene-flow"
    assert join_lines(["  one ", "", " two"]) == "one two"


@pytest.fixture(scope="module")
def recorded_titles() -> dict[str, str]:
    table = CITATIONS / "act-sdp-test.tsv"
    if not table.is_file():
        pytest.skip(f"the citation set is not beside the checkout ({table})")
    with table.open(encoding="utf-8", newline="") as rows:
        return {r["core_id"]: r["citing_title"] for r in csv.DictReader(rows, delimiter="\t")}


@pytest.mark.parametrize(
    ("core_id", "title", "starts", "ends"),
    [
        # a heading-less abstract between a licence paragraph and "1. Introduction"; the recorded
        # title carries the article type
        (
            "186893859",
            "Case Report Molecular Profiling: A Case of ZBTB16-RARA Acute Promyelocytic Leukemia",
            "Several variant RARA translocations have been reported",
            "in patients with this rare form of APL.",
        ),
        # after affiliations and an e-mail, ended by the keywords line
        (
            "43173419",
            "Active facilitation of focus groups: exploring the implementation of inclusive "
            "education with research participants",
            "In this article, we explain how we took an “active” approach",
            "regarded as having additional “actioning” power.",
        ),
        # the recorded title is a running head: the title set in capitals, across an arXiv stamp
        (
            "186934554",
            "ANCOVA: A GLOBAL TEST BASED ON A ROBUST MEASURE OF LOCATION OR QUANTILES WHEN "
            "THERE IS CURVATURE",
            "For two independent groups, let Mj (x) be some conditional measure",
            "testing the global hypothesis can make a practical difference.",
        ),
        # an "abstract" heading; the abstract ends at the copyright line
        (
            "13505159",
            "From the weak to the strong existence property",
            "A hallmark of many an intuitionistic theory is the existence property",
            "is beyond the scope of the current paper.",
        ),
    ],
)
def test_title_and_abstract_are_copied_from_the_page(
    recorded_titles: dict[str, str], core_id: str, title: str, starts: str, ends: str
) -> None:
    got = read_first_page_file(
        CITATIONS / "citing-first-pages" / f"{core_id}.txt", recorded_titles[core_id]
    )
    assert got.title == title
    assert got.title_from_page
    assert got.abstract is not None
    assert got.abstract.startswith(starts)
    assert got.abstract.endswith(ends)


@pytest.mark.parametrize(
    "core_id",
    [
        "2073440",  # an erratum
        "82105846",  # a letter to the editor
        "187936510",  # a working paper's cover page: licence text in two languages, no abstract
        "189217163",  # a reprint note that cites the paper, then the authors' page
    ],
)
def test_pages_without_an_abstract_give_none(recorded_titles: dict[str, str], core_id: str) -> None:
    got = read_first_page_file(
        CITATIONS / "citing-first-pages" / f"{core_id}.txt", recorded_titles[core_id]
    )
    assert got.abstract is None
