"""How a read query's rows become a pandas DataFrame, the one conversion every read of storage/records shares.
NUMERIC values (PostgreSQL's Decimal) come back as floats, the datetime columns parsed, in an optional column order;
nullable integer and boolean columns become pandas' Int64 and object (None, True, False). F is the SQL type of a
float division, the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from decimal import Decimal

import pandas as pd
from sqlalchemy import text

F = "DOUBLE PRECISION"  # float division in both SQLite (REAL affinity) and PostgreSQL


_DATETIMES = ("created", "started", "finished", "heartbeat")


def _frame(conn, sql: str, params: dict | None = None, columns: list[str] | None = None) -> pd.DataFrame:
    result = conn.execute(text(sql), params or {})
    keys = list(result.keys())
    rows = [tuple(float(v) if isinstance(v, Decimal) else v for v in row) for row in result]
    df = pd.DataFrame.from_records(rows, columns=keys)
    for col in _DATETIMES:
        if col in df.columns:
            df[col] = pd.to_datetime(df[col], format="ISO8601")
    if columns is not None:
        df = df[columns + [c for c in df.columns if c not in columns]]
    return df


def _nullable_int(df: pd.DataFrame, *columns: str) -> None:
    for column in columns:
        if column in df.columns:
            df[column] = df[column].astype("Int64")


def _nullable_bool(df: pd.DataFrame, column: str) -> None:
    df[column] = pd.Series([None if pd.isna(v) else bool(v) for v in df[column]], index=df.index, dtype=object)
