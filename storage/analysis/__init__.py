"""What DraftLab concludes from stored rows: the verdict, the k schedule, the cost-aware formula, findings,
collapse, focus, validation, the catalog's best run and a confirm's report."""
