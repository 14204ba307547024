"""Dataset files -> rows -> conversations: the readers the trainers and the Data page share (torch-free)."""
