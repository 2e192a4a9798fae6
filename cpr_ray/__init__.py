"""cpr-ray: build, train and evaluate Cross-Pollination Retrieval on Ray."""

__version__ = "0.1.0"
