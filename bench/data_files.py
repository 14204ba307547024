"""Time reading one alpaca dataset in every file kind: DatasetReader.examples() (what training does
before tokenizing) and DatasetProfile.read (the Data page's preview and histogram, with the bundled
tokenizer), each in a fresh process: the seconds include importing the reader (and `datasets` where
it is needed), the peak is the process's VmHWM. Medians of --runs runs; no run may import torch.

    python bench/data_files.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("a.jsonl", "a.json", "a.csv", "a.parquet", "saved")
PROBE = """
import sys, time, json
from pathlib import Path
path, mode = Path(sys.argv[1]), sys.argv[2]
t = time.perf_counter()
if mode == "examples":
    from backend.core.data.examples import DatasetReader
    count = len(DatasetReader(path).examples())
else:
    from backend.core.data.dataset_profile import DatasetProfile
    count = DatasetProfile.read(str(path), "bundled:tiny").count
seconds = time.perf_counter() - t
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
print(json.dumps({"count": count, "s": seconds, "peak_mb": peak, "torch": "torch" in sys.modules}))
"""


def write_all(folder: Path, rows: int) -> None:
    import pandas as pd
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    records = [{"instruction": f"Question {i}: what follows {i}, in words?", "input": "" if i % 3 else "context",
                "output": " ".join(["the answer is"] * 8) + f" {i + 1}"} for i in range(rows)]
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (folder / "a.json").write_text(json.dumps(records, indent=2))
    frame = pd.DataFrame(records)
    frame.to_csv(folder / "a.csv", index=False)
    frame.to_parquet(folder / "a.parquet")
    Dataset.from_list(records).save_to_disk(str(folder / "saved"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_all(folder, args.rows)
        for kind in KINDS:
            path = folder / kind
            size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            line = f"{kind:10s} {size / 1e6:6.1f} MB"
            for mode in ("examples", "profile"):
                runs = []
                for _ in range(args.runs):
                    out = subprocess.run([sys.executable, "-c", PROBE, str(path), mode], cwd=ROOT, capture_output=True,
                                         text=True, check=True, env={"FINETUNE_STUDIO_HOME": str(folder / "home"),
                                                                     "PATH": "/usr/bin:/bin"})
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                assert all(r["count"] == args.rows and not r["torch"] for r in runs), runs
                seconds = statistics.median(r["s"] for r in runs)
                peak = statistics.median(r["peak_mb"] for r in runs)
                line += f"  {mode} {seconds:5.2f} s, peak {peak:4.0f} MB"
            print(line, flush=True)


if __name__ == "__main__":
    main()
