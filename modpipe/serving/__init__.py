"""Serving the text model with Triton: server launcher, client, CLI (`triton`, `classify`, `bench model`)."""
