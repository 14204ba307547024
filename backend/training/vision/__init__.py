"""Training a vision-language model on image rows: the one door the SFT job takes for a proven VLM folder.

rows.py turns examples (text with `<image>` markers, and their images) into token rows through the
family's processor, the labels on the assistant's text only; collator.py batches them, running the
processor again for the pixel tensors; parts.py says which of the tower, projector and language model
train and how; door.py loads the model and offers the same calls as the text SFT door.
"""
