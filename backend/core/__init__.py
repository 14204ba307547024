"""The foundation: what every other package stands on, torch-free, importing nothing of ours.

The protocol, errors, paths and units; the machine's facts without torch; the config (config/), the
dataset readers the worker and the Data page share (data/), the run folder and its records (runs/),
and the declarations other packages act on (registries/: export formats, serving options, shortcuts).
"""
