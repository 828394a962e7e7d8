"""The model catalog: one YAML file per vLLM-Omni pipeline (data only)."""
