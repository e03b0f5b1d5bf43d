"""The job queue: experiments and training jobs enqueued, runs claimed and moved on, device leases, liveness
(heartbeats and the sweep of what a dead worker left)."""
