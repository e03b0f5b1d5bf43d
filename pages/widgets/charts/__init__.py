"""Every Altair chart the dashboard draws, built from the DataFrames the pages download as CSV. This step moves the
one module into the package unchanged (charts/speedup.py); the next splits it into one module per family of charts."""

from pages.widgets.charts.speedup import *  # noqa: F403
