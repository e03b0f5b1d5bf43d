"""What to serve and how: each engine's flags for the chosen configuration (deploy), export, and the queue of
confirm jobs."""
