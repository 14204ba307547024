"""The speed shortcuts of a training step: the torch-free registry and the torch tricks it installs."""
