"""posteriordb reference posteriors: the models as plain NumPyro programs and a loader for the draws.

``programs`` holds the nine models (Stan code in posteriordb, rewritten for NumPyro) and the case
table that says how to build each one's data and how to read its draws; ``posteriordb`` finds the
read-only data folder, reads the zipped JSON files and compares draws with the reference draws.
Used by ``tests/test_reference_posteriors.py`` and ``bench/reference_posteriors.py``.
"""
