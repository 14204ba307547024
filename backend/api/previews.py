"""The readers the studio previews a dataset with, through the face: torch-free at every depth.

They live with the training data readers (backend.core.data), which the worker uses to train on
the very same records; import-linter (pyproject.toml) holds that this chain never reaches torch.
"""

from backend.core.data.dataset_profile import DatasetProfile
from backend.core.data.objective_records import ObjectiveRecords, read_objective_records, reward_columns

__all__ = ["DatasetProfile", "ObjectiveRecords", "read_objective_records", "reward_columns"]
