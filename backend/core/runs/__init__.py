"""The run folder: what a run leaves on disk (RunFolder), continuing it, and the records its jobs write."""
