"""Structured pruning of a trained model: rank layers, attention head groups and FFN channels by a stated
importance on calibration data, remove what the user picks, write a model transformers loads.

request.py (torch-free) parses and checks the picks against config.json; importance.py measures;
removal.py cuts the loaded model in place; report.py shapes the figures for the CLI and the studio.
"""
