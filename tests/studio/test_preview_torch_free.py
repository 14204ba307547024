"""The data preview opens Parquet and Arrow files in the studio's own process: torch must stay unloaded.

`datasets` reads them (the one named exception in pyproject.toml's import contracts); the contract can
only see imports, so this holds what `datasets` does at run time too, in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import BUNDLED_MODEL, ROOT

PROBE = """
import json, sys
from backend.api.previews import DatasetProfile, read_objective_records
profile = DatasetProfile.read(sys.argv[1], model_path=sys.argv[2])
read_objective_records(sys.argv[1], "dpo", model_path=sys.argv[2])  # the other preview, refusing: still no torch
heavy = sorted(m for m in ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate") if m in sys.modules)
print(json.dumps({"problem": profile.problem, "count": profile.count, "measured": profile.measured, "heavy": heavy,
                  "datasets": "datasets" in sys.modules}))
"""


def test_a_parquet_preview_loads_no_torch(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(12)]
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    done = subprocess.run([sys.executable, "-c", PROBE, str(data), str(BUNDLED_MODEL)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["problem"] == "" and seen["count"] == 12 and seen["measured"] == 12
    assert seen["datasets"], "the probe must really read through datasets"
    assert seen["heavy"] == [], f"previewing a Parquet file imported {seen['heavy']}"
