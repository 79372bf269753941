"""Load generation: session pools and the closed/open loops (loadgen), one level in one or several
processes (levels, workers), the prompts and their tokenizer (prompts)."""
