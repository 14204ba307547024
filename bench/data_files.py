"""Time reading one alpaca dataset in every file kind: DatasetReader.examples() (what training does
before tokenizing) and DatasetProfile.read (the Data page's preview and histogram).

    python bench/data_files.py --rows 200000

Each kind is read in a fresh process (so `import datasets` is counted where it is paid) and the
figures are the median of --runs runs. Files go to a temporary folder, removed at the end.
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
t0 = time.perf_counter()
from backend.training.examples import DatasetReader
from backend.training.dataset_profile import DatasetProfile
from pathlib import Path
path = Path(sys.argv[1])
t = time.perf_counter(); n = len(DatasetReader(path).examples()); read = time.perf_counter() - t
t = time.perf_counter(); p = DatasetProfile.read(str(path), "bundled:tiny"); profile = time.perf_counter() - t
import resource
print(json.dumps({"examples": n, "read_s": read, "profile_s": profile, "count": p.count,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch": "torch" in sys.modules}))
"""


def write_all(folder: Path, rows: int) -> None:
    import pandas as pd
    from datasets import Dataset

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
            runs = []
            for _ in range(args.runs):
                out = subprocess.run([sys.executable, "-c", PROBE, str(path)], cwd=ROOT, capture_output=True,
                                     text=True, check=True, env={"FINETUNE_STUDIO_HOME": str(folder / "home"),
                                                                 "PATH": "/usr/bin:/bin"})
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            med = {key: statistics.median(r[key] for r in runs) for key in ("read_s", "profile_s", "rss_mb")}
            print(f"{kind:10s} {size / 1e6:7.1f} MB  examples() {med['read_s']:.2f} s  profile {med['profile_s']:.2f} s"
                  f"  peak RSS {med['rss_mb']:.0f} MB  torch imported: {runs[0]['torch']}")


if __name__ == "__main__":
    main()
