"""The registry of the five papers' tables and figures, `manytask reproduce` and the results page generated from
the result files (docs/results.md)."""
