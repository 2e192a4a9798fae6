"""Build the small raw sample corpus shipped in ``cpr_ray/sample/data``.

Why this exists: the pipeline's ingest stage reads Semantic Scholar (S2) bulk shards and an
OpenAlex snapshot. Tests, the dry run and new users need a corpus in exactly those raw formats that
is small enough to ship in the package, yet made of REAL bibliographic records so that every stage
(join by DOI / MAG / PubMed, unmatched papers, citation graph, abstracts, venue impact, quarantine
of bad lines, citing-sentence recovery from S2ORC spans) runs on data with real structure.

Source: ``<reference>/openalex/works-sample.jsonl.gz`` (3,684 real OpenAlex works, CC0) plus the
8 real S2ORC sample records of ``<reference>/s2-samples/s2orc`` (ODC-BY), copied unchanged.
Everything S2-shaped is converted from the OpenAlex records by the deterministic rules below;
``cpr_ray/sample/PROVENANCE.md`` documents each rule and what is not real.

Output (gzipped JSONL, byte-identical on rerun)::

    <out>/s2/papers/papers-0000.jsonl.gz
    <out>/s2/papers/papers-9999-malformed.jsonl.gz
    <out>/s2/abstracts/abstracts-0000.jsonl.gz
    <out>/s2/citations/citations-0000.jsonl.gz
    <out>/s2/citations/citations-9999-malformed.jsonl.gz
    <out>/s2/publication-venues/publication-venues-0000.jsonl.gz
    <out>/s2/s2orc/s2orc-0000.jsonl.gz
    <out>/openalex/works/updated_date=<max updated_date>/part_0000.gz
    <out>/openalex/sources/updated_date=<max updated_date>/part_0000.gz

Run: ``python -m cpr_ray.sample.build_sample [--reference DIR] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

Record = dict[str, Any]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REFERENCE = REPO_ROOT.parent / "shared" / "reference"
DEFAULT_OUT = REPO_ROOT / "cpr_ray" / "sample" / "data"

WORKS_FILE = Path("openalex") / "works-sample.jsonl.gz"
S2ORC_FILE = Path("s2-samples") / "s2orc" / "s2orc-sample.jsonl.gz"

# Share of works routed to each S2 join key (see PROVENANCE.md, "Join-key routes").
UNMATCHED_SHARE = 0.03  # of all works: S2 side keeps no external id at all
PUBMED_SHARE = 0.05  # of works with a PMID: S2 side keeps only PubMed
MAG_SHARE = 0.10  # of works with DOI and MAG: S2 side keeps only MAG
OPENALEX_ABSTRACTS_KEPT = 150  # works whose abstract_inverted_index stays in the OpenAlex file
UNRESOLVED_CITATIONS = 20  # S2 citations with citedcorpusid null
S2ORC_MAX_BYTES = 1_000_000  # above this (uncompressed) keep only the 2 smallest S2ORC records

# Namespace of the deterministic S2 publication-venue ids (uuid5 of the OpenAlex source URL).
VENUE_NAMESPACE = uuid.NAMESPACE_URL

# OpenAlex license -> S2 / Unpaywall license string (S2 writes e.g. "CCBY", "CCBYSA", "CCBYNC").
LICENSE_MAP: dict[str, str] = {
    "cc-by": "CCBY",
    "cc-by-sa": "CCBYSA",
    "cc-by-nc": "CCBYNC",
    "cc-by-nd": "CCBYND",
    "cc-by-nc-sa": "CCBYNCSA",
    "cc-by-nc-nd": "CCBYNCND",
    "cc0": "CC0",
    "public-domain": "PD",
}
# OpenAlex oa_status -> S2 openaccessinfo.status (Unpaywall has no "diamond": it counts as gold).
OA_STATUS_MAP: dict[str, str] = {
    "gold": "GOLD",
    "diamond": "GOLD",
    "green": "GREEN",
    "hybrid": "HYBRID",
    "bronze": "BRONZE",
}
VENUE_TYPE_MAP: dict[str, str] = {"journal": "journal", "conference": "conference"}

WORK_ID_RE = re.compile(r"W(\d+)$")
PMID_RE = re.compile(r"(\d+)$")
ARXIV_DOI_RE = re.compile(r"^10\.48550/arxiv\.(.+)$", re.IGNORECASE)
DOI_PREFIX = "https://doi.org/"

ROUTES = (
    "doi",
    "mag-only (DOI dropped)",
    "mag-only (no DOI in OpenAlex)",
    "pubmed-only (DOI+MAG dropped)",
    "none (ids dropped)",
    "none (no ids in OpenAlex)",
)


# --------------------------------------------------------------------------------------------
# small helpers


def corpus_id(work_or_url: Record | str) -> int:
    """The integer after ``W`` in an OpenAlex work id (URL or record)."""
    url = work_or_url if isinstance(work_or_url, str) else work_or_url["id"]
    match = WORK_ID_RE.search(url)
    if not match:
        raise ValueError(f"not an OpenAlex work id: {url!r}")
    return int(match.group(1))


def stable_rank(salt: str, cid: int) -> str:
    """A deterministic pseudo-random sort key for ``cid``, independent per ``salt``."""
    return hashlib.sha256(f"{salt}:{cid}".encode()).hexdigest()


def pick_share(salt: str, cids: Iterable[int], count: int) -> set[int]:
    """The ``count`` ids with the smallest salted hash: a deterministic random subset."""
    return set(sorted(cids, key=lambda c: stable_rank(salt, c))[:count])


def s2_timestamp(updated_date: str) -> str:
    """OpenAlex ``2025-11-06T04:12:42.849631`` -> S2 ``2025-11-06T04:12:42.849Z``."""
    moment = datetime.fromisoformat(updated_date)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def bare_doi(work: Record) -> str | None:
    """S2 form of the DOI: no ``https://doi.org/`` prefix, case as given by OpenAlex."""
    doi = work.get("doi")
    if not doi:
        return None
    return doi[len(DOI_PREFIX) :] if doi.startswith(DOI_PREFIX) else doi


def pmid_digits(work: Record) -> str | None:
    pmid = (work.get("ids") or {}).get("pmid")
    match = PMID_RE.search(pmid) if pmid else None
    return match.group(1) if match else None


def mag_id(work: Record) -> str | None:
    mag = (work.get("ids") or {}).get("mag")
    return str(mag) if mag else None


def arxiv_id(doi: str | None) -> str | None:
    """arXiv id from an arXiv DataCite DOI (``10.48550/arxiv.1811.11469`` -> ``1811.11469``)."""
    match = ARXIV_DOI_RE.match(doi) if doi else None
    return match.group(1) if match else None


def source_of(work: Record) -> Record | None:
    return (work.get("primary_location") or {}).get("source")


def venue_uuid(source_id: str) -> str:
    return str(uuid.uuid5(VENUE_NAMESPACE, source_id))


def rebuild_abstract(inverted: dict[str, list[int]]) -> str:
    """Place each word at each of its positions, then join the words in position order."""
    positions: dict[int, str] = {}
    for word, places in inverted.items():
        for place in places:
            positions[place] = word
    return " ".join(positions[p] for p in sorted(positions))


def map_license(work: Record) -> str | None:
    for location in ("primary_location", "best_oa_location"):
        license_ = (work.get(location) or {}).get("license")
        if license_:
            return LICENSE_MAP.get(license_)
    return None


def dumps(record: Any) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write text lines gzipped with a fixed header (mtime 0, no file name): same bytes each run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with (
        path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz,
    ):
        for line in lines:
            gz.write(line.encode("utf-8") + b"\n")
            count += 1
    return count


def write_jsonl(path: Path, records: Iterable[Record]) -> int:
    return write_lines(path, (dumps(r) for r in records))


def read_jsonl_gz(path: Path) -> Iterator[Record]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


# --------------------------------------------------------------------------------------------
# join-key routes


@dataclass(frozen=True)
class Routes:
    """Which S2 join key each work keeps (corpus id -> route name from ``ROUTES``)."""

    by_work: dict[int, str]

    def counts(self) -> Counter[str]:
        return Counter(self.by_work.values())


def assign_routes(works: list[Record]) -> Routes:
    """Deterministically decide which external ids the S2 copy of each work keeps.

    Order: ~3% of all works lose every id (unmatched; works with no DOI/MAG/PMID at all count
    towards that share), then ~5% of the remaining works with a PMID keep only PubMed, then ~10%
    of the remaining works with DOI and MAG keep only MAG. Everything else keeps all its ids.
    """
    cids = sorted(corpus_id(w) for w in works)
    by_cid = {corpus_id(w): w for w in works}
    no_ids = {c for c, w in by_cid.items() if not (bare_doi(w) or mag_id(w) or pmid_digits(w))}
    target_unmatched = max(0, round(UNMATCHED_SHARE * len(works)) - len(no_ids))
    dropped = pick_share("unmatched", (c for c in cids if c not in no_ids), target_unmatched)

    remaining = [c for c in cids if c not in no_ids and c not in dropped]
    with_pmid = [c for c in remaining if pmid_digits(by_cid[c])]
    pubmed = pick_share("pubmed", with_pmid, round(PUBMED_SHARE * len(with_pmid)))

    remaining = [c for c in remaining if c not in pubmed]
    with_doi_mag = [c for c in remaining if bare_doi(by_cid[c]) and mag_id(by_cid[c])]
    mag = pick_share("mag", with_doi_mag, round(MAG_SHARE * len(with_doi_mag)))

    routes: dict[int, str] = {}
    for cid, work in by_cid.items():
        if cid in no_ids:
            routes[cid] = "none (no ids in OpenAlex)"
        elif cid in dropped:
            routes[cid] = "none (ids dropped)"
        elif cid in pubmed:
            routes[cid] = "pubmed-only (DOI+MAG dropped)"
        elif cid in mag:
            routes[cid] = "mag-only (DOI dropped)"
        elif bare_doi(work):
            routes[cid] = "doi"
        else:  # no DOI; has MAG and/or PMID, kept as they are
            routes[cid] = "mag-only (no DOI in OpenAlex)"
    return Routes(routes)


def s2_external_ids(work: Record, route: str) -> Record:
    """S2 ``externalids`` (key order of the real S2 papers sample) for a work and its route."""
    cid = corpus_id(work)
    doi, mag, pmid = bare_doi(work), mag_id(work), pmid_digits(work)
    if route.startswith("none"):
        doi = mag = pmid = None
    elif route.startswith("pubmed-only"):
        doi = mag = None
    elif route.startswith("mag-only"):
        doi = pmid = None
    return {
        "ACL": None,
        "DBLP": None,
        "ArXiv": arxiv_id(doi),
        "MAG": mag,
        "CorpusId": str(cid),
        "PubMed": pmid,
        "DOI": doi,
        "PubMedCentral": None,
    }


# --------------------------------------------------------------------------------------------
# S2 datasets


def s2_paper(work: Record, route: str) -> Record:
    source = source_of(work)
    return {
        "corpusid": corpus_id(work),
        "externalids": s2_external_ids(work, route),
        "url": work["id"],
        "title": work.get("title"),
        "authors": [],
        "venue": (source or {}).get("display_name") or "",
        "publicationvenueid": venue_uuid(source["id"]) if source else None,
        "year": work.get("publication_year"),
        "referencecount": len(work.get("referenced_works") or []),
        "citationcount": work.get("cited_by_count", 0),
        "influentialcitationcount": 0,
        "isopenaccess": bool((work.get("open_access") or {}).get("is_oa")),
        "s2fieldsofstudy": None,
        "publicationtypes": None,
        "publicationdate": work.get("publication_date"),
        "journal": None,
        "updated": s2_timestamp(work["updated_date"]),
    }


def s2_abstract(work: Record, route: str) -> Record:
    ids = s2_external_ids(work, route)
    open_access = work.get("open_access") or {}
    return {
        "corpusid": corpus_id(work),
        "openaccessinfo": {
            "externalids": {k: ids[k] for k in ("MAG", "ACL", "DOI", "PubMedCentral", "ArXiv")},
            "license": map_license(work),
            "url": open_access.get("oa_url"),
            "status": OA_STATUS_MAP.get(open_access.get("oa_status") or ""),
        },
        "abstract": rebuild_abstract(work["abstract_inverted_index"]),
        "updated": s2_timestamp(work["updated_date"]),
    }


def citation(citing: int, cited: int | None, updated: str) -> Record:
    return {
        "citingcorpusid": str(citing),
        "citedcorpusid": None if cited is None else str(cited),
        "isinfluential": False,
        "contexts": [],
        "intents": [],
        "updated": updated,
    }


def s2_citations(works: list[Record], sample_ids: set[int]) -> tuple[list[Record], int]:
    """In-sample citation edges (self-references skipped), then a few unresolved ones.

    Returns the records and the number of in-sample edges.
    """
    in_sample: list[Record] = []
    outside: list[tuple[str, int, str]] = []
    for work in works:
        citing, updated = corpus_id(work), s2_timestamp(work["updated_date"])
        cited_ids = sorted({corpus_id(r) for r in work.get("referenced_works") or []})
        for cited in cited_ids:
            if cited in sample_ids and cited != citing:
                in_sample.append(citation(citing, cited, updated))
            elif cited not in sample_ids:
                outside.append((stable_rank(f"unresolved:{cited}", citing), citing, updated))
    unresolved = sorted(outside)[:UNRESOLVED_CITATIONS]
    unresolved.sort(key=lambda item: item[1])
    extra = [citation(citing, None, updated) for _, citing, updated in unresolved]
    return in_sample + extra, len(in_sample)


def s2_venue(source: Record) -> Record:
    issns = source.get("issn") or []
    issn_l = source.get("issn_l")
    return {
        "id": venue_uuid(source["id"]),
        "alternate_issns": [i for i in issns if i != issn_l],
        "alternate_names": [],
        "alternate_urls": [],
        "issn": issn_l,
        "name": source.get("display_name"),
        "type": VENUE_TYPE_MAP.get(source.get("type") or ""),
        "url": None,
    }


def s2orc_lines(path: Path) -> list[str]:
    """The real S2ORC sample lines, unchanged; only the 2 smallest if the whole is too big."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle if line.strip()]
    if sum(len(line.encode()) for line in lines) > S2ORC_MAX_BYTES:
        keep = set(sorted(lines, key=len)[:2])
        lines = [line for line in lines if line in keep]
    return lines


def s2orc_citations(lines: list[str]) -> list[Record]:
    """The citation edges the real S2ORC records resolve (bibentry matched_paper_id), with no
    contexts, so the dry run shows citing sentences being recovered from the full text."""
    out: list[Record] = []
    for line in lines:
        record = json.loads(line)
        entries = json.loads(record["content"]["annotations"].get("bibentry") or "[]")
        cited = sorted(
            {
                int(e["attributes"]["matched_paper_id"])
                for e in entries
                if (e.get("attributes") or {}).get("matched_paper_id") is not None
            }
        )
        updated = record.get("updated") or "2023-01-01T00:00:00Z"
        out.extend(citation(int(record["corpusid"]), c, updated) for c in cited)
    return out


def malformed_paper_lines(good: list[Record]) -> list[str]:
    """Exactly 4 bad lines, each a different failure, built from real paper records."""
    truncated = dumps(good[0])
    wrong_id = dict(good[1], corpusid="abc")
    no_id = {k: v for k, v in good[2].items() if k != "corpusid"}
    no_id["externalids"] = dict(no_id["externalids"], CorpusId=None)
    return [
        truncated[: len(truncated) // 2],  # truncated JSON
        dumps(wrong_id),  # corpusid not numeric
        dumps(no_id),  # no corpusid at all
        "<html><body>503 Service Unavailable</body></html>",  # not JSON
    ]


def malformed_citation_lines(good: list[Record]) -> list[str]:
    """Exactly 2 bad lines: a truncated JSON record and one whose citingcorpusid is null."""
    truncated = dumps(good[0])
    return [truncated[: len(truncated) // 2], dumps(dict(good[1], citingcorpusid=None))]


# --------------------------------------------------------------------------------------------
# OpenAlex snapshot


def openalex_work(work: Record, sample_urls: set[str], keep_abstract: bool) -> Record:
    location = work.get("primary_location") or {}
    source = location.get("source")
    record: Record = {
        "id": work["id"],
        "doi": work.get("doi"),
        "ids": work.get("ids"),
        "title": work.get("title"),
        "publication_year": work.get("publication_year"),
        "publication_date": work.get("publication_date"),
        "primary_location": {
            "source": None
            if source is None
            else {k: source.get(k) for k in ("id", "display_name", "type", "issn_l", "issn")},
            "license": location.get("license"),
        },
        "topics": work.get("topics"),
        "primary_topic": work.get("primary_topic"),
        "referenced_works": [r for r in work.get("referenced_works") or [] if r in sample_urls],
        "counts_by_year": work.get("counts_by_year"),
        "cited_by_count": work.get("cited_by_count"),
        "abstract_inverted_index": work.get("abstract_inverted_index") if keep_abstract else None,
        "updated_date": work["updated_date"],
    }
    return record


def citedness_year(works: list[Record]) -> int:
    """Y of the 2-year mean citedness: the latest *complete* year in the counts_by_year data.

    The snapshot's own year is partial (it ends at the snapshot date) and would make every
    venue look uncited, so it is not used.
    """
    snapshot_year = int(max(w["updated_date"] for w in works)[:4])
    years = {c["year"] for w in works for c in w.get("counts_by_year") or []}
    return max(y for y in years if y < snapshot_year)


def two_year_mean_citedness(works: list[Record], year: int) -> float:
    """Citations received in ``year`` by the works published in year-1 and year-2, per work."""
    recent = [w for w in works if w.get("publication_year") in (year - 1, year - 2)]
    if not recent:
        return 0.0
    cites = sum(
        c["cited_by_count"]
        for w in recent
        for c in w.get("counts_by_year") or []
        if c["year"] == year
    )
    return cites / len(recent)


def openalex_sources(works: list[Record], year: int) -> list[Record]:
    by_source: dict[str, list[Record]] = defaultdict(list)
    for work in works:
        source = source_of(work)
        if source:
            by_source[source["id"]].append(work)
    records = []
    for source_id in sorted(by_source, key=lambda s: (len(s), s)):
        members = by_source[source_id]
        source = source_of(members[0]) or {}
        records.append(
            {
                "id": source_id,
                "display_name": source.get("display_name"),
                "type": source.get("type"),
                "issn_l": source.get("issn_l"),
                "issn": source.get("issn"),
                "works_count": len(members),
                "summary_stats": {
                    "2yr_mean_citedness": two_year_mean_citedness(members, year),
                    "h_index": None,
                    "i10_index": None,
                },
                "updated_date": max(w["updated_date"] for w in members),
            }
        )
    return records


# --------------------------------------------------------------------------------------------
# driver


def load_works(reference: Path) -> list[Record]:
    works = list(read_jsonl_gz(reference / WORKS_FILE))
    return sorted(works, key=corpus_id)


def build(reference: Path, out: Path, year: int | None = None) -> dict[str, Any]:
    """Write the whole sample under ``out`` and return the counts for the summary."""
    works = load_works(reference)
    sample_ids = {corpus_id(w) for w in works}
    sample_urls = {w["id"] for w in works}
    routes = assign_routes(works)
    y = year if year is not None else citedness_year(works)
    snapshot = max(w["updated_date"] for w in works)[:10]

    for sub in ("s2", "openalex"):  # stale partitions from an earlier run must not linger
        shutil.rmtree(out / sub, ignore_errors=True)
    s2, oa = out / "s2", out / "openalex"

    papers = [s2_paper(w, routes.by_work[corpus_id(w)]) for w in works]
    write_jsonl(s2 / "papers" / "papers-0000.jsonl.gz", papers)
    write_lines(s2 / "papers" / "papers-9999-malformed.jsonl.gz", malformed_paper_lines(papers))

    with_abstract = [w for w in works if w.get("abstract_inverted_index")]
    abstracts = [s2_abstract(w, routes.by_work[corpus_id(w)]) for w in with_abstract]
    write_jsonl(s2 / "abstracts" / "abstracts-0000.jsonl.gz", abstracts)

    citations, n_in_sample = s2_citations(works, sample_ids)
    s2orc = s2orc_lines(reference / S2ORC_FILE)
    s2orc_edges = s2orc_citations(s2orc)
    write_jsonl(s2 / "citations" / "citations-0000.jsonl.gz", citations + s2orc_edges)
    write_lines(
        s2 / "citations" / "citations-9999-malformed.jsonl.gz", malformed_citation_lines(citations)
    )

    sources = openalex_sources(works, y)
    venues = [s2_venue(s) for s in sources]
    write_jsonl(s2 / "publication-venues" / "publication-venues-0000.jsonl.gz", venues)

    write_lines(s2 / "s2orc" / "s2orc-0000.jsonl.gz", s2orc)

    kept = pick_share(
        "openalex-abstract", (corpus_id(w) for w in with_abstract), OPENALEX_ABSTRACTS_KEPT
    )
    oa_works = [openalex_work(w, sample_urls, corpus_id(w) in kept) for w in works]
    write_jsonl(oa / "works" / f"updated_date={snapshot}" / "part_0000.gz", oa_works)
    write_jsonl(oa / "sources" / f"updated_date={snapshot}" / "part_0000.gz", sources)

    years = [w["publication_year"] for w in works if w.get("publication_year")]
    self_refs = sum(1 for w in works if w["id"] in (w.get("referenced_works") or []))
    return {
        "works": len(works),
        "routes": {r: routes.counts().get(r, 0) for r in ROUTES},
        "s2 papers": len(papers),
        "s2 papers with ArXiv id (from arXiv DOI)": sum(
            1 for p in papers if p["externalids"]["ArXiv"]
        ),
        "s2 abstracts": len(abstracts),
        "s2 abstracts by license": dict(
            sorted(Counter(str(a["openaccessinfo"]["license"]) for a in abstracts).items())
        ),
        "s2 citations in sample": n_in_sample,
        "s2 citations unresolved (citedcorpusid null)": len(citations) - n_in_sample,
        "self-references skipped in S2 citations": self_refs,
        "s2 publication venues": len(venues),
        "s2orc records (real, copied)": len(s2orc),
        "s2 citations resolved by the s2orc records (no contexts)": len(s2orc_edges),
        "openalex works": len(oa_works),
        "openalex works keeping abstract_inverted_index": len(kept),
        "openalex referenced_works kept (in sample)": sum(
            len(w["referenced_works"]) for w in oa_works
        ),
        "openalex sources": len(sources),
        "sources with 2yr_mean_citedness > 0": sum(
            1 for s in sources if s["summary_stats"]["2yr_mean_citedness"] > 0
        ),
        "2yr_mean_citedness year Y": y,
        "snapshot partition": f"updated_date={snapshot}",
        "publication years": f"{min(years)}-{max(years)}",
        "malformed lines": {"papers": 4, "citations": 2},
    }


def print_summary(counts: dict[str, Any], out: Path) -> None:
    print(f"sample written to {out}")
    for key, value in counts.items():
        if isinstance(value, dict):
            print(f"  {key}:")
            for sub, number in value.items():
                print(f"    {sub}: {number}")
        else:
            print(f"  {key}: {value}")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"  total size of {out}: {total / 1e6:.2f} MB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        type=Path,
        default=DEFAULT_REFERENCE,
        help="shared reference folder (default: ../shared/reference)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: cpr_ray/sample/data)"
    )
    parser.add_argument(
        "--citedness-year",
        type=int,
        default=None,
        help="year Y of 2yr_mean_citedness (default: latest counts_by_year year)",
    )
    args = parser.parse_args(argv)
    counts = build(args.reference, args.out, args.citedness_year)
    print_summary(counts, args.out)


if __name__ == "__main__":
    main()
