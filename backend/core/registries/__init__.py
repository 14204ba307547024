"""Declarations other packages act on: the export formats, what serving offers, the speed shortcuts."""
