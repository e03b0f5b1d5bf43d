"""The formulas (SPEC's α, speedup, tokens per round), the statistics over stored rows (intervals, paired
speedups, output tests), the Monte Carlo simulation and the Python metrics oracle the SQL is tested against."""
