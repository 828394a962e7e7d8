"""The start-up model: what vLLM-Omni does when it launches a set of stages (engine config
checks, admission, which stages are co-resident, the memory each stage finds) and the problem
codes it predicts."""
