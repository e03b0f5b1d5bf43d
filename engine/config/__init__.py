"""The run's description, torch-free: the swept variables and settings, a run's configuration, the drafter
declarations with their serving tables, sampling settings, head settings and file layouts, the limits."""
