"""Chat rooms over WebSockets (app.py)."""
