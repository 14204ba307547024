"""The worker's job table (backend/jobs/table.py): exactly one entry per JobKind, each resolving to that
job's run function, and no job imported before it runs."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from backend.core.protocol import JobKind
from backend.jobs.table import JOBS
from backend.runtime.processes import worker_env
from tests.conftest import ROOT


def test_the_table_covers_exactly_the_job_kinds():
    assert sorted(JOBS) == sorted(get_args(JobKind))


def test_every_entry_resolves_to_its_jobs_run_function():
    for kind, load in JOBS.items():
        run = load()
        assert callable(run)
        assert (run.__module__, run.__name__) == (f"backend.jobs.{kind}", f"run_{kind}")


def test_the_table_imports_no_job_until_one_runs():
    """The worker imports the table at start; only the job it runs may load (and with it torch)."""
    script = ("import sys; import backend.worker.runner; from backend.jobs.table import JOBS\n"
              "jobs = lambda: sorted(m for m in sys.modules if m.startswith('backend.jobs.') and m != 'backend.jobs.table')\n"
              "print(jobs(), 'torch' in sys.modules)\n"
              "JOBS['prune']()\n"
              "print(jobs())\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=worker_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.splitlines()
    assert before == "[] False"
    assert after == "['backend.jobs.prune']"
