"""The engine: decoding (one speculative loop, its cache, verification and drafters), models, prompts, training,
the formulas and statistics, and the torch-free description of a run. Never imports the database or the UI."""
