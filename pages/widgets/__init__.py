"""What every page draws with: charts, links between pages, the login, form parsing, uploads and the pair check."""
