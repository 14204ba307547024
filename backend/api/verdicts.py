"""What stops a run before it starts, as the studio asks it (backend.estimate.feasibility, torch-free)."""

from backend.estimate.feasibility import before_start, lenient_config, verdicts

__all__ = ["before_start", "lenient_config", "verdicts"]
