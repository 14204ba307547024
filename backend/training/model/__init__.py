"""Loading the base model and planning the techniques that run on this machine."""
