"""Content-word count (CW): a query's words minus its stop words, a proxy for its complexity.

The built-in list is English function words without the question words (how, what, which, …):
some published stop lists hold them, and a research query's "how to" or "which" is part of what
it asks, so dropping them undercounts it (`cpr_ray.config.QUESTION_WORDS`; the config refuses a
list that holds them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import polars as pl

STOP_WORDS: tuple[str, ...] = tuple(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing don down during each few for
    from further had has have having he her here hers herself him himself his i if in into is it
    its itself just may me might more most must my myself no nor not now of off on once only or
    other our ours ourselves out over own same shall she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up upon
    very via was we were while will with within without would you your yours yourself
    yourselves s t""".split()
)
WORD = r"\w+"


def content_word_counts(texts: Sequence[str], stop_words: Iterable[str] = STOP_WORDS) -> np.ndarray:
    """(n,) int32: per text, its lower-cased word tokens that are not stop words."""
    stop = pl.Series(sorted({w.lower() for w in stop_words}), dtype=pl.String)
    words = pl.Series(list(texts), dtype=pl.String).str.to_lowercase().str.extract_all(WORD)
    counts = words.list.eval(pl.element().is_in(stop.implode()).not_()).list.sum()
    return counts.fill_null(0).cast(pl.Int32).to_numpy()
