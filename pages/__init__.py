"""The dashboard: one module per page (Streamlit + Altair), drawn from panels and widgets; reads through storage,
loads no model."""
