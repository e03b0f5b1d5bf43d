"""What a job runs in: its context (store, cancellation, progress), device placement, the model cache and
database retries."""
