"""How vLLM lays out quantized weights: the scale overhead it stores beside them and the padding
its MoE kernels apply, as named constants with their sources (read by inputs/quantization.py)."""

# Per-tensor and per-channel scales: one fp32 per tensor or per output row, below 4 / 1024 bytes
# per weight for any layer at least 1024 wide (estimate, high).
QUANT_SCALE_BYTES_PER_WEIGHT = 4 / 1024

# vllm 0.11.0 model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights: per backend,
# (hidden, intermediate per partition) round-up. MARLIN: "n % 256 == 0 and k % 128 == 0" -> intermediate
# 128, hidden 256; SM100 FlashInfer TRTLLM/BF16 and ROCm: 256, 256; SM100 FlashInfer CUTLASS and SM90
# FlashInfer BF16: 128, 128; TRITON (CUDA): intermediate 64, hidden as is.
MXFP4_PADDING = {"marlin": (256, 128), "triton": (1, 64), "sm90_fi_mxfp4_bf16": (128, 128),
                 "sm100_fi_mxfp4_mxfp8_cutlass": (128, 128), "sm100_fi_mxfp4_mxfp8_trtllm": (256, 256),
                 "sm100_fi_mxfp4_bf16": (256, 256), "rocm": (256, 256)}
# The backend unknown: the largest round-up of any backend in each dimension (errs high).
MXFP4_PADDING_UNKNOWN = (256, 256)
