"""The database: connection (SQLite or PostgreSQL), schema, migrations, settings and storage's errors."""
