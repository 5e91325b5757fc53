"""What the server benchmarks share: prompts and load (load.py), per-request timings (metrics.py),
results files and ratios (report.py), the models (models.py) and the systems under test (systems.py)."""
