"""The headless CLI (`python -m backend.cli`, `finetune-studio SUBCOMMAND`)."""
