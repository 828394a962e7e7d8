"""Data files shipped with the package (the GPU catalog)."""
