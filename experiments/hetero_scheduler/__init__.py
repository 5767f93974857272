"""Heterogeneity-aware scheduling study: reproduce HopsHetero, then beat it (see RESULTS.md)."""
