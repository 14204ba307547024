"""The training objectives (SFT, DPO, KTO, GRPO): one typed registry and one module per objective."""
