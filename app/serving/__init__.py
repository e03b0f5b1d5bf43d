"""Serving engines as processes: starting and stopping vLLM, `draftlab confirm` and its queued job, production
counters scraped or imported, completions load."""
