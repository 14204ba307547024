"""The memory estimate as the studio asks it: a run's estimate, the longest row, the cards, the notes,
and the changes that make a run fit.

The facade hands these on from backend.estimate (torch-free at every depth, which import-linter
holds), so the studio reaches the estimate through one door and a change inside the estimate's
package does not reach the window.
"""

from backend.estimate import count_params, load_model_config, read_dims
from backend.estimate.calibration import Calibration
from backend.estimate.cards import CARD_SIZES_GB, cuda_cards, usable_bytes
from backend.estimate.cuda import ALLOCATOR_RESERVE, CONTEXT_NOTE, CUDA_CONTEXT_BYTES, RESERVE_NOTE
from backend.estimate.fit import FitPlan, fit_estimator, make_fit
from backend.estimate.objectives import PART_NOTES
from backend.estimate.run_estimate import estimate_run
from backend.estimate.seq_len import card_words, longest_seq_len, run_total

__all__ = ["ALLOCATOR_RESERVE", "CARD_SIZES_GB", "CONTEXT_NOTE", "CUDA_CONTEXT_BYTES", "Calibration", "FitPlan",
           "PART_NOTES", "RESERVE_NOTE", "card_words", "count_params", "cuda_cards", "estimate_run", "fit_estimator",
           "load_model_config", "longest_seq_len", "make_fit", "read_dims", "run_total", "usable_bytes"]
