"""The run's configuration: the pydantic models, the YAML file, and the one-line errors and help."""
