"""Query-set metrics for complexity-aware training: how a (synthesized) query set compares with
the reference queries, and how diverse the queries written for one document are.

- **Dist-Sim**: cosine between the mean embeddings of the set and of the reference queries (1:
  the set sits where the reference queries do in the encoder's space).
- **Len-Sim**: 1 minus the total-variation distance between the word-length histograms.
- **CE**: the share of query pairs of one document that a cross-encoder calls paraphrases (high:
  the "several queries" say one thing several ways).
- **Self-BLEU**: the mean sentence BLEU (sacrebleu, 0-1) of each query against the other queries
  of its document; high means low lexical diversity.
- **CW**: the distribution of content-word counts (`cw.content_word_counts`).

Pure functions over arrays and lists; the encoders are passed in, so tests give them tiny models
and a report names the models it used.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import sacrebleu

from cpr_ray.queries.content_words import STOP_WORDS, content_word_counts

PairScorer = Callable[[list[tuple[str, str]]], np.ndarray]


def dist_sim(embeddings: np.ndarray, reference: np.ndarray) -> float:
    """Cosine between the two sets' mean embeddings (rows need not be normalised)."""
    a, b = embeddings.mean(axis=0), reference.mean(axis=0)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norm if norm else 0.0


def word_lengths(texts: Iterable[str]) -> np.ndarray:
    return np.array([len(t.split()) for t in texts], dtype=np.int64)


def len_sim(lengths: np.ndarray, reference: np.ndarray) -> float:
    """1 - total-variation distance between the two word-length distributions (1: the same)."""
    if not len(lengths) or not len(reference):
        return 0.0
    top = int(max(lengths.max(), reference.max())) + 1
    p = np.bincount(lengths, minlength=top) / len(lengths)
    q = np.bincount(reference, minlength=top) / len(reference)
    return float(1.0 - 0.5 * np.abs(p - q).sum())


def sibling_pairs(groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """Every unordered pair of distinct queries written for the same document."""
    return [pair for g in groups for pair in itertools.combinations(g, 2)]


def paraphrase_share(scores: np.ndarray, threshold: float = 0.5) -> float:
    """The share of pairs scored at least `threshold` (a cross-encoder's paraphrase probability)."""
    return float(np.mean(scores >= threshold)) if len(scores) else 0.0


def self_bleu(groups: Sequence[Sequence[str]]) -> float:
    """Mean sentence BLEU (0-1) of each query against the other queries of its document."""
    scores = [
        sacrebleu.sentence_bleu(q, [o for j, o in enumerate(g) if j != i]).score / 100.0
        for g in groups
        if len(g) > 1
        for i, q in enumerate(g)
    ]
    return float(np.mean(scores)) if scores else 0.0


def cw_distribution(texts: Sequence[str], stop_words: Iterable[str] = STOP_WORDS) -> dict:
    counts = content_word_counts(texts, stop_words)
    if not len(counts):
        return {"mean": 0.0, "quantiles": {}, "histogram": {}}
    values, freq = np.unique(counts, return_counts=True)
    return {
        "mean": round(float(counts.mean()), 3),
        "quantiles": {f"p{q}": float(np.percentile(counts, q)) for q in (10, 25, 50, 75, 90)},
        "histogram": {str(int(v)): int(f) for v, f in zip(values, freq, strict=True)},
    }


Embed = Callable[[list[str]], np.ndarray]  # texts → one vector per text, as rows


def embed_once(embed: Embed) -> Embed:
    """`embed` that encodes each distinct text once across calls: the reports of a build's
    queries and of a synthesized set both compare against the build's queries, which would
    otherwise be encoded three times (and a set's repeated queries once each)."""
    seen: dict[str, np.ndarray] = {}

    def embedded(texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in seen]
        if new:
            seen.update(zip(new, embed(new), strict=True))
        return np.stack([seen[t] for t in texts]) if texts else embed([])

    return embedded


def qd_report(
    groups: Mapping[Any, Sequence[str]],
    reference: Sequence[str],
    *,
    embed: Callable[[list[str]], np.ndarray],
    paraphrase: PairScorer | None = None,
    threshold: float = 0.5,
    stop_words: Iterable[str] = STOP_WORDS,
) -> dict[str, Any]:
    """All Q-D metrics of a query set given as document -> its queries, against `reference`."""
    queries = [q for g in groups.values() for q in g]
    pairs = sibling_pairs(list(groups.values()))
    report: dict[str, Any] = {
        "queries": len(queries),
        "documents": len(groups),
        "dist_sim": round(dist_sim(embed(queries), embed(list(reference))), 4)
        if queries and reference
        else None,
        "len_sim": round(len_sim(word_lengths(queries), word_lengths(reference)), 4),
        "self_bleu": round(self_bleu(list(groups.values())), 4),
        "sibling_pairs": len(pairs),
        "cw": cw_distribution(queries, stop_words),
    }
    if paraphrase is not None:
        scores = paraphrase(pairs) if pairs else np.zeros(0)
        report["ce_paraphrase_share"] = round(paraphrase_share(scores, threshold), 4)
    return report


def cross_encoder_scorer(model: str, device: str = "cpu", batch_size: int = 64) -> PairScorer:
    """A sentence-transformers CrossEncoder as a pair scorer, its scores as probabilities."""
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(model, device=device)

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        raw = np.asarray(ce.predict(pairs, batch_size=batch_size, show_progress_bar=False))
        if raw.ndim == 2:  # two labels: the paraphrase probability is the last one
            exp = np.exp(raw - raw.max(axis=1, keepdims=True))
            return exp[:, -1] / exp.sum(axis=1)
        return raw if raw.min() >= 0 and raw.max() <= 1 else 1 / (1 + np.exp(-raw))

    return score
