"""Q-D metrics on hand-made query sets whose values are known."""

from __future__ import annotations

import numpy as np
import pytest

from cpr_ray.queries.qd_metrics import (
    cross_encoder_scorer,
    cw_distribution,
    dist_sim,
    embed_once,
    len_sim,
    paraphrase_share,
    qd_report,
    self_bleu,
    sibling_pairs,
    word_lengths,
)
from tests import tiny_models


def test_dist_sim_is_the_cosine_of_the_mean_embeddings():
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])  # mean (0.5, 0.5)
    assert dist_sim(ref, ref) == pytest.approx(1.0)
    assert dist_sim(np.array([[2.0, 2.0]]), ref) == pytest.approx(1.0)  # scale does not matter
    assert dist_sim(np.array([[1.0, -1.0]]), ref) == pytest.approx(0.0)
    assert dist_sim(np.array([[1.0, 0.0]]), ref) == pytest.approx(1 / np.sqrt(2))


def test_embed_once_encodes_each_distinct_text_once_and_keeps_repeats_in_place():
    calls: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.array([[float(len(t)), 1.0] for t in texts]).reshape(len(texts), 2)

    cached = embed_once(embed)
    first = cached(["ab", "abc", "ab"])
    again = cached(["abc", "abcd", "ab"])
    assert calls == [["ab", "abc"], ["abcd"]]
    assert first.tolist() == [[2.0, 1.0], [3.0, 1.0], [2.0, 1.0]]  # the repeat counts in a mean
    assert again.tolist() == [[3.0, 1.0], [4.0, 1.0], [2.0, 1.0]]
    assert cached([]).shape == (0, 2)


def test_len_sim_is_one_minus_the_total_variation_distance():
    same = word_lengths(["how to a b", "how to c d"])
    assert len_sim(same, same) == 1.0
    assert len_sim(np.array([2, 2]), np.array([5, 5])) == 0.0
    # {2: 1/2, 3: 1/2} against {2: 1}: distance 1/2
    assert len_sim(np.array([2, 3]), np.array([2, 2])) == pytest.approx(0.5)


def test_self_bleu_of_identical_and_disjoint_siblings():
    assert self_bleu([["how to grow crystals fast", "how to grow crystals fast"]]) == pytest.approx(
        1
    )
    assert self_bleu([["alpha beta gamma delta", "one two three four"]]) == 0.0
    assert self_bleu([["a lone query"]]) == 0.0  # no sibling to compare with
    mixed = self_bleu([["how to grow crystals fast", "how to grow crystals slowly"]])
    assert 0.0 < mixed < 1.0


def test_sibling_pairs_and_the_paraphrase_share():
    pairs = sibling_pairs([["a", "b", "c"], ["d"], ["e", "f"]])
    assert pairs == [("a", "b"), ("a", "c"), ("b", "c"), ("e", "f")]
    assert paraphrase_share(np.array([0.9, 0.2, 0.5, 0.1])) == 0.5
    assert paraphrase_share(np.zeros(0)) == 0.0


def test_content_word_distribution():
    cw = cw_distribution(["how to grow crystals", "how to make the best of it", "crystals"])
    # content words: how grow crystals (3); how make best (3); crystals (1)
    assert cw["histogram"] == {"1": 1, "3": 2}
    assert cw["mean"] == pytest.approx(7 / 3, abs=1e-3) and cw["quantiles"]["p50"] == 3.0


def _bag_of_words(texts: list[str]) -> np.ndarray:
    vocab = ["crystals", "grow", "soil", "water"]
    return np.array([[t.split().count(w) for w in vocab] for t in texts], dtype=float) + 1e-3


def test_the_report_with_a_tiny_random_cross_encoder(tmp_path, minilm):
    ce = tiny_models.tiny_bert(
        minilm, tmp_path / "ce", head="classifier", layers=1, intermediate=37, max_positions=512
    )
    scorer = cross_encoder_scorer(ce)

    groups = {1: ["how to grow crystals", "how to grow crystals fast"], 2: ["how to water soil"]}
    reference = ["how to grow crystals", "how to water soil"]
    report = qd_report(groups, reference, embed=_bag_of_words, paraphrase=scorer)
    assert (report["queries"], report["documents"], report["sibling_pairs"]) == (3, 2, 1)
    pair_score = scorer([("how to grow crystals", "how to grow crystals fast")])
    assert report["ce_paraphrase_share"] == paraphrase_share(pair_score)
    assert 0.0 <= pair_score[0] <= 1.0
    assert report["len_sim"] == pytest.approx(2 / 3, abs=1e-4)  # {4: 2/3, 5: 1/3} vs {4: 1}
    assert 0.9 < report["dist_sim"] <= 1.0
    assert report["self_bleu"] == pytest.approx(self_bleu(list(groups.values())), abs=1e-4)
