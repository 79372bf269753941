"""Byte units every layer sizes memory in, defined once (a leaf: importing it loads nothing)."""

MIB = 1024**2
GIB = 1024**3
GB = 10**9  # decimal gigabytes: SGLang's --hicache-size unit
