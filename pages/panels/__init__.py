"""The parts of the experiment-detail page (its sections and panels), the New-experiment form's parts (its models,
prompt source and work estimate) and the forms' estimates."""
