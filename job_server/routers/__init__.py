"""One router per resource: packages, jobs, version (FastAPI's "Bigger Applications")."""
