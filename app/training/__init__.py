"""Training jobs (distillation, EAGLE-3 heads) as the worker and `draftlab distill` / `train-head` run them."""
