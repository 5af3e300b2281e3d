"""Hugging Face Inference Endpoints entry point: the toolkit loads `EndpointHandler` from the
repository's root handler.py. The handler itself lives in app/endpoint.py."""

from app.endpoint import EndpointHandler

__all__ = ["EndpointHandler"]
