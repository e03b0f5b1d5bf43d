"""The parts of the experiment-detail page (its sections and panels) and the forms' estimates."""
