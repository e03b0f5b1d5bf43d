"""The worker: its loop over queued jobs, the process per device and their supervisor, timed runs."""
