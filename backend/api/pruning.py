"""The prune job's request and report as the Prune tab reads them (torch-free parts of backend.pruning).

The picks are checked against config.json before a worker starts (request.py) and the report is read
back from the pruned folder (report.py); neither imports torch, which import-linter holds.
"""

from backend.pruning.report import RANKING, REPORT, format_report, read_json
from backend.pruning.request import MIN_FFN_KEEP, PruneRequest, Shape, out_problem

__all__ = ["MIN_FFN_KEEP", "RANKING", "REPORT", "PruneRequest", "Shape", "format_report", "out_problem",
           "read_json"]
