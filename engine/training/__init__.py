"""Training drafts: distillation of a draft model and EAGLE-3 heads, over one shared data and sampling module."""
