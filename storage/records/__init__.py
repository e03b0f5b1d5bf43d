"""Rows read and written: runs and their rollups, recorded prompts and rounds, confirms, production counters,
workers, and the columns each table shows."""
