"""Inputs, read and validated: the GPU inventory (catalog, NVML), the model catalog, Hugging Face
configs and checkpoint headers, existing stage config files and start-up logs. Nothing here
models memory; every layer above reads its data from here."""
