"""What stops a run before it starts, as the studio asks it (backend.estimate.feasibility and
start_verdicts, torch-free)."""

from backend.estimate.feasibility import before_start, lenient_config, verdicts
from backend.estimate.start_verdicts import memory_verdict, overridden, runs_folder_verdicts

__all__ = ["before_start", "lenient_config", "memory_verdict", "overridden", "runs_folder_verdicts", "verdicts"]
