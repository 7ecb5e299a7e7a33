"""Plotly Dash app showing runs live (reads through monitor's query layer / HTTP API only)."""
