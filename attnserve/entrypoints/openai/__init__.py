"""The OpenAI-compatible HTTP server (FastAPI, pydantic, uvicorn load only from here)."""
