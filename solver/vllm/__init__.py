"""What vLLM and vLLM-Omni do, as named constants with their sources and version ranges: the
lowest layer, imported by everything above and importing nothing of the package but errors."""
