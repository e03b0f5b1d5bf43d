"""What every page draws with: charts, links between pages, the login, form parsing, the New-experiment form's checks
and defaults, uploads and the pair check."""
