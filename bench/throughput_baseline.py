"""The bare transformers + peft Trainer that bench/throughput.py compares the studio with.

A user's plain script: the same model, data, LoRA settings, batch, sequence length and
checkpointing as the studio's run, SDPA attention, bf16 on CUDA, the Trainer's defaults otherwise,
Hub kernels off (bench/hub_kernels.py). Prints one `RESULT {json}` line: useful tokens/s over
all steps and over the steps after `warmup` (each step's useful tokens and end time are recorded),
the losses, and on CUDA the peaks of torch's allocated and reserved memory.

    python bench/throughput_baseline.py '{"model": ..., "data": ..., "seq_len": 2048, ...}'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers


def rows_of(path: str) -> list[dict]:
    text = open(path, encoding="utf-8").read()
    return json.loads(text) if path.endswith(".json") else [json.loads(line) for line in text.splitlines() if line.strip()]


def encoder(tok, seq_len: int):
    """Raw text: every token a target (bos + text + eos); alpaca: the answer only, through the chat template."""
    def encode(r: dict) -> dict:
        if "text" in r:
            ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok(r["text"], add_special_tokens=False)[
                "input_ids"] + [tok.eos_token_id]
            ids = ids[:seq_len]
            return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}
        prompt = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
        msgs = [{"role": "user", "content": prompt}]
        p = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": r["output"]}], tokenize=False)
        pi = tok(p, add_special_tokens=False)["input_ids"]
        fi = tok(full, add_special_tokens=False)["input_ids"][:seq_len]
        return {"input_ids": fi, "attention_mask": [1] * len(fi), "labels": ([-100] * len(pi) + fi[len(pi):])[:len(fi)]}
    return encode


def main(cfg: dict) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainerCallback,
                              TrainingArguments)

    tok = AutoTokenizer.from_pretrained(cfg["model"])
    ds = Dataset.from_list([encoder(tok, cfg["seq_len"])(r) for r in rows_of(cfg["data"])])
    if cfg["validation_split"]:
        ds = ds.train_test_split(test_size=cfg["validation_split"], seed=cfg["seed"])["train"]
    cuda = torch.cuda.is_available()
    quant = {}
    if cfg["method"] == "qlora":
        from transformers import BitsAndBytesConfig
        quant = {"quantization_config": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if cuda else torch.float32), "device_map": {"": 0 if cuda else "cpu"}}
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa", **quant, **hub_kernels.load_kwargs())
    checkpointing = bool(cfg.get("checkpointing"))
    if quant:
        from peft import prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    model = get_peft_model(model, LoraConfig(r=cfg["rank"], lora_alpha=cfg["alpha"], target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    base = DataCollatorForSeq2Seq(tok, padding="longest")
    counts: list[int] = []

    def collate(features):
        batch = base(features)
        counts.append(int((batch["labels"][:, 1:] != -100).sum()))
        return batch

    args = TrainingArguments(output_dir=cfg["out"], max_steps=cfg["steps"], per_device_train_batch_size=cfg["batch"],
                             learning_rate=cfg["lr"], logging_steps=1, save_strategy="no", report_to=[],
                             disable_tqdm=True, seed=cfg["seed"], use_cpu=not cuda, bf16=cuda,
                             gradient_checkpointing=checkpointing,
                             gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None)
    ends: list[float] = []

    class Clock(TrainerCallback):
        """Times the steps as the studio does: from train begin to each step's end."""
        begin = 0.0

        def on_train_begin(self, *a, **k):
            Clock.begin = time.monotonic()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.monotonic() - Clock.begin)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate, callbacks=[Clock()])
    trainer.train()
    steps = len(ends)
    per_step = counts[:steps]  # one batch per optimizer step (no accumulation here)
    warmup = min(cfg.get("warmup", 0), steps - 1)
    steady = sum(per_step[warmup:]) / (ends[-1] - ends[warmup - 1]) if warmup else sum(per_step) / ends[-1]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"tokens_per_s": sum(per_step) / ends[-1], "steady_tokens_per_s": steady, "warmup": warmup, "steps": steps,
            "threads": torch.get_num_threads(), "first_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "checkpointing": checkpointing}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
