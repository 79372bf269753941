"""Foundation layer: the machines trtkv targets: accelerators, the TensorRT-LLM/Triton version matrix, and where
TensorRT-LLM runs on this machine."""
