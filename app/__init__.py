"""The top layer: the `draftlab` command line (cli.py assembles the commands), the worker and its jobs (runs,
training, confirms), serving engines as processes, and the dashboard's entry script and launcher."""
