"""`cpr judge-check`: measure each LLM judge on a shipped gold set before a build pays for it.

A build spends most of its LLM budget on its judges (the analogy judgment, the transfer check,
the query review, the same-problem check and strongest choice, the usefulness of positives, the
grading of negatives). Whether a model is good enough for them is known only after the build,
unless it is measured first: this package runs the real task classes on hand-labelled cases
(`gold/`, each read twice), reports the binarised κ the method reports with its interval and
the precision a build's passes would have at the corpus's base rate, and projects what a full
build would cost with that model (`projection.py`).
"""
