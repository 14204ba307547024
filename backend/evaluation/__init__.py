"""Measuring and talking to a trained run: perplexity, exact match, generation, sample answers."""
