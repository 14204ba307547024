"""Training data: reading dataset files, their shapes and layouts, and tokenizing them for a fine-tune."""
