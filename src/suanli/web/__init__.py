"""The web console: pages rendered on the server (Jinja2) with htmx for the live parts, over the public REST API.

Every page reads and writes through `/api/v1` in-process (`apicall.py`) with the session's own bearer token, so
the console can do exactly what the API lets that user do, and nothing more: no query of its own, no back door.
"""
