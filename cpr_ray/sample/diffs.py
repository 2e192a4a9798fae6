"""A Semantic Scholar release diff (and the OpenAlex partition that comes with it), made from a
built corpus, with the changes to the mined pairs it must cause written down beforehand.

For the refresh's tests and benchmark. Given the bulk shards a build read and the pairs it
mined, `make_diff` writes, in the layout `tests/standins/s2_api.py` serves
(``ROOT/diffs/{from}/{to}/{dataset}/{update,delete}-00000.jsonl.gz``):

- **new papers**: for chosen pairs (q, d), a copy of d's records under a new corpus id and DOI,
  with its abstract, an OpenAlex work (same topics, in a new ``updated_date=`` partition of the
  OpenAlex folder) and a citation q → copy with a citing sentence: a new cross-topic pair;
- **changed papers**: a new title for the cited paper of chosen pairs (those pairs' texts
  change, so they are judged again) and for papers in no pair (nothing to judge);
- **deleted papers**: the cited paper of chosen pairs (their pairs are retracted);
- **deleted citations**: chosen pairs' citation records (retracted too);
- **relinked papers** (on request): for papers in no pair, a newer version of the OpenAlex work
  they link to, carrying one of their identifiers only (DOI, MAG or PubMed id), so the refresh
  must find each by that identifier; the work is otherwise the same, so the paper is too.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

NEW_ID_BASE = 9_000_000_000


@dataclass
class DiffPlan:
    """Pairs as (base_id, cited_id): what the diff must do to the mined pairs."""

    new_pairs: set[tuple[int, int]] = field(default_factory=set)
    changed_pairs: set[tuple[int, int]] = field(default_factory=set)
    retracted_pairs: set[tuple[int, int]] = field(default_factory=set)
    deleted_papers: set[int] = field(default_factory=set)
    changed_papers: set[int] = field(default_factory=set)
    relinked_papers: dict[str, int] = field(default_factory=dict)  # key type → corpus id


def _lines(folder: Path) -> Iterator[dict]:
    for path in sorted(folder.rglob("*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the sample's deliberately malformed shards
                if isinstance(rec, dict):
                    yield rec


def _by_id(records: Iterator[dict]) -> dict[int, dict]:
    """Records by corpus id; the sample's deliberately bad ids are left out."""
    out = {}
    for rec in records:
        value = str(rec.get("corpusid", ""))
        if value.isdigit():
            out[int(value)] = rec
    return out


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def make_diff(
    s2: Path,
    openalex: Path,
    out: Path,
    pairs: pa.Table,
    *,
    releases: tuple[str, str],
    new: int = 1,
    changed: int = 1,
    deleted: int = 1,
    deleted_citations: int = 1,
    unpaired_changes: int = 1,
    openalex_date: str = "2026-12-01",
    seed: int = 0,
    relinked: tuple[str, ...] = (),
) -> DiffPlan:
    """Write one release step's diff under `out` and a works partition under `openalex` (by
    default one record of each kind of change, dated after the sample's snapshot)."""
    rng = random.Random(seed)
    pair_list = sorted(
        {
            (int(b), int(c))
            for b, c in zip(pairs["base_id"].to_pylist(), pairs["cited_id"].to_pylist())
        }
    )
    by_cited: dict[int, list[tuple[int, int]]] = {}
    for p in pair_list:
        by_cited.setdefault(p[1], []).append(p)
    papers = _by_id(_lines(s2 / "papers"))
    abstracts = _by_id(_lines(s2 / "abstracts"))
    works = {}
    for w in _lines(openalex / "works"):
        doi = (w.get("doi") or "").lower().removeprefix("https://doi.org/")
        if doi:
            works[doi] = w

    def work_of(corpus_id: int) -> dict | None:
        doi = ((papers.get(corpus_id, {}).get("externalids") or {}).get("DOI") or "").lower()
        return works.get(doi) if doi else None

    cited = sorted(d for d in by_cited if d in papers)
    rng.shuffle(cited)
    # a new paper copies a cited one whose OpenAlex work is found by DOI (its topics)
    take_new = [d for d in cited if work_of(d) is not None][:new]
    rest = [d for d in cited if d not in set(take_new)]
    if len(take_new) < new or changed + deleted + deleted_citations > len(rest):
        raise ValueError(f"the corpus has {len(cited)} cited papers; the diff asks for more")
    take_changed = rest[:changed]
    take_deleted = rest[changed : changed + deleted]
    take_cit = rest[changed + deleted : changed + deleted + deleted_citations]
    plan = DiffPlan()
    up_papers, up_abstracts, up_citations, up_works = [], [], [], []
    stamp = f"{releases[1]}T00:00:00Z"
    for i, d in enumerate(take_new):
        src = papers[d]
        new_id = NEW_ID_BASE + i
        doi = f"10.5555/cpr-refresh.{seed}.{i}"
        rec = dict(src)
        rec.update(
            corpusid=new_id,
            title=f"{src.get('title') or ''} (follow-up {i})",
            updated=stamp,
            # no venue: a new paper must not change which venues are the top ones
            publicationvenueid=None,
            venue="",
            externalids={
                **(src.get("externalids") or {}),
                "DOI": doi,
                "MAG": None,
                "PubMed": None,
                "CorpusId": str(new_id),
            },
        )
        up_papers.append(rec)
        if d in abstracts:
            up_abstracts.append({**abstracts[d], "corpusid": new_id, "updated": stamp})
        work = dict(work_of(d) or {})
        work.update(
            id=f"https://openalex.org/W{new_id}",
            doi=f"https://doi.org/{doi}",
            ids={"openalex": f"https://openalex.org/W{new_id}"},
            updated_date=openalex_date,
        )
        up_works.append(work)
        base = by_cited[d][0][0]
        up_citations.append(
            {
                "citingcorpusid": str(base),
                "citedcorpusid": str(new_id),
                "isinfluential": False,
                "intents": ["methodology"],
                "contexts": [f"We adapt the approach of the follow-up study {i}."],
                "updated": stamp,
            }
        )
        plan.new_pairs.add((base, new_id))
    for d in take_changed:
        up_papers.append(
            {**papers[d], "title": f"{papers[d].get('title')} (revised)", "updated": stamp}
        )
        plan.changed_pairs.update(by_cited[d])
        plan.changed_papers.add(d)
    in_pairs = {x for p in pair_list for x in p}
    unpaired = sorted(set(papers) - in_pairs)
    for d in rng.sample(unpaired, unpaired_changes):
        up_papers.append(
            {**papers[d], "title": f"{papers[d].get('title')} (revised)", "updated": stamp}
        )
        plan.changed_papers.add(d)
    for kind in relinked:
        d, work = _relinked_work(kind, papers, work_of, unpaired, plan)
        up_works.append({**work, "updated_date": openalex_date})
        plan.relinked_papers[kind] = d
    del_papers = [{"corpusid": d} for d in take_deleted]
    for d in take_deleted:
        plan.retracted_pairs.update(by_cited[d])
        plan.deleted_papers.add(d)
    del_citations = []
    for d in take_cit:
        base = by_cited[d][0][0]
        del_citations.append({"citingcorpusid": str(base), "citedcorpusid": str(d)})
        plan.retracted_pairs.add((base, d))

    step = out / "diffs" / releases[0] / releases[1]
    _write(step / "papers" / "update-00000.jsonl.gz", up_papers)
    _write(step / "papers" / "delete-00000.jsonl.gz", del_papers)
    _write(step / "abstracts" / "update-00000.jsonl.gz", up_abstracts)
    _write(step / "citations" / "update-00000.jsonl.gz", up_citations)
    _write(step / "citations" / "delete-00000.jsonl.gz", del_citations)
    _write(openalex / "works" / f"updated_date={openalex_date}" / "part_0000.gz", up_works)
    known = (
        json.loads((out / "releases.json").read_text())
        if (out / "releases.json").exists()
        else [releases[0]]
    )
    (out / "releases.json").write_text(json.dumps(sorted({*known, *releases})))
    return plan


RELINK_IDS = {"doi": "DOI", "mag": "MAG", "pmid": "PubMed"}


def _relinked_work(
    kind: str,
    papers: dict[int, dict],
    work_of: Callable[[int], dict | None],
    unpaired: list[int],
    plan: DiffPlan,
) -> tuple[int, dict]:
    """The first paper in no pair and not yet changed that links to a work by DOI and has a
    `kind` identifier, and that work with only this identifier of the paper's."""
    used = plan.changed_papers | set(plan.relinked_papers.values())
    for d in unpaired:
        ids = papers[d].get("externalids") or {}
        work = work_of(d)
        if d in used or work is None or not ids.get(RELINK_IDS[kind]):
            continue
        own = {"openalex": work["id"]}
        if kind != "doi":
            own[kind] = str(ids[RELINK_IDS[kind]])
        return d, {**work, "doi": work["doi"] if kind == "doi" else None, "ids": own}
    raise ValueError(f"no paper in no pair links to a work by DOI and has a {kind} id")
