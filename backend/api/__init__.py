"""The facade: what the studio calls beyond the foundation (backend.core), and nothing the backend itself needs.

How a client starts a job (launch, distributed), a chat session's client side, presets, the run list,
the data previews, and one door each to the estimate, the verdicts and the prune request. Torch-free
at every depth; only clients (the studio, the CLI) import it, which pyproject.toml's contracts hold.
"""
